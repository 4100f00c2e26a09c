"""What the pipeline REALLY fed ``model.fit``: the sampling audit of the batches a real fit consumed.

``tfdpbnn.audit.sampling_audit`` draws batches from the pipeline outside training. ``ParticipationRecorder``
audits the run itself: it builds the batches with the library's own ``tfdpbnn.data.poisson_batches`` over
the user's ``(x, y, sample_weight)`` with each example's id carried beside its features through the same
Poisson mask, records the ids of every batch as ``model.fit`` pulls it and strips them before the model sees
the batch (the model, the loss and the optimizer get exactly what ``poisson_batches(x, y, ...)`` would give
them). As a Keras callback it counts the optimizer steps the fit ran; ``result()`` then tests the recorded
batches against Poisson sampling at the declared q with ``tfdpbnn.audit.audit_participation`` (Abadi et al.
2016; Mironov, Talwar & Zhang 2019: participation total, per-example counts and batch sizes), and refuses
when the number of recorded batches is not the number of steps (then it cannot say which batches the
optimizer got). A mutation injected with ``tfdpbnn.audit.inject_bug`` while the pipeline is built (e.g.
"sample-rate-1.5x") is in the batches the fit trains on, and the result flags it.
"""

from __future__ import annotations

import threading

import numpy as np
import tensorflow as tf

from tfdpbnn._validation import check_open_unit


class ParticipationRecorder(tf.keras.callbacks.Callback):
    """Record the example ids of every batch ``model.fit`` consumes from a Poisson pipeline, then audit them.

    Usage::

        recorder = tfdpbnn.audit.ParticipationRecorder()
        data = recorder.poisson_batches(x, y, sample_rate=q)      # arguments of tfdpbnn.data.poisson_batches
        model.fit(data, epochs=E, callbacks=[recorder])
        recorder.result()                                        # SamplingAuditResult; .flagged

    The ids are recorded when a batch is produced; ``model.fit`` consumes every batch of a finite pipeline in
    order, and ``result`` checks that the counts agree. Single-device fits (under ``tf.distribute`` audit the
    replicas' shards with ``tfdpbnn.audit.sampling_audit(replicas=R)``).
    """

    def __init__(self):
        super().__init__()
        self._lock = threading.Lock()
        self._batches: list[np.ndarray] = []
        self._steps = 0
        self._start = None
        self.num_examples: int | None = None
        self.sample_rate: float | None = None

    def poisson_batches(self, x, y=None, sample_rate=None, steps_per_epoch=None, seed=None,
                        sample_weight=None, **kwargs):
        """``tfdpbnn.data.poisson_batches(x, y, ...)`` whose batches are recorded as the fit reads them.

        Same arguments, same elements, same sampling declaration and data fingerprint; each example's id
        (its index on axis 0) rides through the Poisson mask beside ``x`` and is removed before the batch
        leaves the pipeline.
        """
        from tfdpbnn.data import poisson_batches
        from tfdpbnn.data.sampling import find_spec, tag
        from tfdpbnn.record.store import data_fingerprint, tag_data_fingerprint

        sizes = {int(np.shape(t)[0]) for t in tf.nest.flatten(x)}
        if len(sizes) != 1:
            raise ValueError(f"x: every array must have the same number of examples, got {sorted(sizes)}")
        n = sizes.pop()
        source = poisson_batches({"x": x, "id": np.arange(n, dtype=np.int64)}, y, sample_rate,
                                 steps_per_epoch, seed, sample_weight, **kwargs)
        has_targets = y is not None

        def record(ids):
            with self._lock:
                self._batches.append(ids.numpy())
            return np.int64(0)

        def strip(*element):
            features = element[0]
            done = tf.py_function(record, [features["id"]], tf.int64)
            with tf.control_dependencies([done]):
                x_b = tf.nest.map_structure(tf.identity, features["x"])
            return x_b if not has_targets else (x_b, *element[1:])

        dataset = source.map(strip)  # sequential: ids are recorded in the order the fit reads the batches
        spec = find_spec(source)
        self.num_examples, self.sample_rate = n, float(spec.sample_rate)
        parts = [x] + [a for a in (y, sample_weight) if a is not None]
        data = parts if sample_weight is None else parts[:-1]   # x and y: sample weights are not the data
        fingerprint = data_fingerprint([tf.convert_to_tensor(t).numpy() for p in data
                                        for t in tf.nest.flatten(p)])
        return tag_data_fingerprint(tag(dataset, spec), fingerprint)

    def on_train_begin(self, logs=None):
        """Keras callback: remember the optimizer's step count when a fit starts."""
        self._start = int(self.model.optimizer.iterations.numpy())

    def on_train_end(self, logs=None):
        """Keras callback: add the optimizer steps this fit ran."""
        self._steps += int(self.model.optimizer.iterations.numpy()) - self._start

    @property
    def batches(self) -> list[np.ndarray]:
        """The ids of each batch produced so far, in order."""
        with self._lock:
            return list(self._batches)

    @property
    def steps(self) -> int:
        """Optimizer steps run by the fits this recorder was a callback of."""
        return self._steps

    def result(self, alpha=1e-3):
        """``audit_participation`` of the recorded batches against Poisson sampling at the declared q."""
        from tfdpbnn.audit.sampling import audit_participation

        alpha = check_open_unit("alpha", alpha)
        batches = self.batches
        if self.num_examples is None:
            raise ValueError("no pipeline: build the batches with recorder.poisson_batches(...) first")
        if not batches:
            raise ValueError("no batches recorded: pass the recorder's pipeline to model.fit")
        if self._steps != len(batches):
            raise ValueError(f"the pipeline produced {len(batches)} batches but the fits with this recorder "
                             f"as a callback ran {self._steps} optimizer steps, so it cannot tell which "
                             "batches the optimizer got; pass the recorder in callbacks and let each fit "
                             "read whole epochs")
        return audit_participation(batches, self.num_examples, self.sample_rate, alpha)


def fit_sampling_audit(num_examples=2000, sample_rate=0.01, steps=300, broken=None, seed=0,
                       alpha=1e-3):
    """The sampling audit of a real ``model.fit``: a linear classifier trained with DP-SGD on Poisson batches.

    ``num_examples`` Gaussian examples (4 features, 3 classes), ``tfdpbnn.DPSGDOptimizer`` with
    ``sampling="poisson"`` at ``sample_rate``, one epoch of ``steps`` batches from
    ``ParticipationRecorder.poisson_batches`` (a fixed debugging seed, so the audit repeats); returns
    ``ParticipationRecorder.result(alpha)``. ``broken="sample-rate-1.5x"`` injects that mutation
    (``tfdpbnn.audit.inject_bug``) into the pipeline the fit trains on.
    """
    import contextlib

    import tfdpbnn
    from tfdpbnn._validation import check_positive_int, check_sample_rate
    from tfdpbnn.audit.mutations import inject_bug

    n = check_positive_int("num_examples", num_examples)
    q = check_sample_rate("sample_rate", sample_rate)
    steps = check_positive_int("steps", steps)
    if broken not in (None, "sample-rate-1.5x"):
        raise ValueError(f"broken must be None or 'sample-rate-1.5x' (the pipeline mutation a single-device "
                         f"fit reads), got {broken!r}")
    rng = np.random.default_rng(seed)
    x, y = rng.normal(size=(n, 4)).astype(np.float32), rng.integers(0, 3, n)
    recorder = ParticipationRecorder()
    tf.keras.utils.set_random_seed(seed)  # before the pipeline: its draws then repeat within one process too
    with inject_bug(broken) if broken else contextlib.nullcontext():
        data = recorder.poisson_batches(x, y, sample_rate=q, steps_per_epoch=steps, seed=seed,
                                        debug_fixed_seed=True)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3)])
    optimizer = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=n, batch_size=max(1, round(q * n)),
                                       sampling="poisson")
    model.compile(optimizer=optimizer,
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(data, epochs=1, callbacks=[recorder], verbose=0)
    return recorder.result(alpha)


__all__ = ["ParticipationRecorder", "fit_sampling_audit"]
