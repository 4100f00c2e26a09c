"""The state and checks every tfdpbnn DP optimizer shares (DP-SGD, Abadi et al. 2016).

``DPOptimizerMixin`` sits in front of one of tensorflow-privacy's vectorized Keras optimizers
(``VectorizedDPKerasSGDOptimizer``, ``VectorizedDPKerasAdamOptimizer``), so each public optimizer IS one of
them, and replaces their gradient step with its ``DPMechanism`` (``optimizer.mechanism``,
``tfdpbnn.optimizers.mechanism``):

  g = (sum_i min(1, C/||g_i||) g_i + N(0, (sigma C)^2 I)) / B  +  grad(regularization)

where ``g_i`` is the gradient of example i's DATA loss, ``B`` the EXPECTED batch size (a constant, so the
division is post-processing; docs/soundness.md, finding 4) and the regularization (``model.losses``: KL
terms, priors, weight decay) is data-independent and never clipped (docs/soundness.md, finding 5). Each
subclass's module holds only its update rule (``_dp_gradients``). What accounting needs (sigma, C, the sample
rate, the sampling scheme, the neighboring relation) lives in non-trainable optimizer variables (so
``tf.train.Checkpoint`` and ``model.save`` carry it) and in ``get_config``; the number of steps is
``optimizer.iterations``.

Epsilon is never derived from declarations alone: each step records its realized batch size in the privacy
ledger (``tfdpbnn.record.ledger_state``), ``fit`` checks the input against the declarations before the
first step (``tfdpbnn.optimizers.fit_checks``), and the printed epsilon composes the phases that really ran
(``tfdpbnn.record.ledger``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import math
import os
import sys
import warnings
import weakref

import tensorflow as tf

from tfdpbnn import _adapters, _private_api
from tfdpbnn._validation import (
    check_choice,
    check_nonnegative,
    check_nonnegative_int,
    check_open_unit,
    check_positive,
    check_positive_int,
)
from tfdpbnn.callbacks import NO_RELEASED_METRICS
from tfdpbnn.clipping import check_per_example_independence
from tfdpbnn.clipping.engine import METHODS as CLIPPING_METHODS
from tfdpbnn.data.distributed import check_distributed_input
from tfdpbnn.optimizers import fit_checks, keras_integration, known_structure, outside_reads, state_checks
from tfdpbnn.optimizers.mechanism import DPGradients, DPMechanism
from tfdpbnn.optimizers.per_example_loss import compiled_per_example_loss_fn
from tfdpbnn.privacy import sound_accountants
from tfdpbnn.privacy.budget import NEIGHBORING, SAMPLINGS, steps_per_epoch
from tfdpbnn.privacy.noise import check_debug_noise_seed
from tfdpbnn.record import attributes
from tfdpbnn.record.ledger import Phase
from tfdpbnn.record.ledger_state import LedgerState, describe_source, planned_phase, variable_name
from tfdpbnn.record.run_record import RunRecord, settle_open_loops
from tfdpbnn.record.statement import build_statement

#: The statement's ``asserted_by_user`` entry of every custom loop (``begin_training``): the loop picks the
#: batches, and nothing tells its rows apart (augmented copies of one example, one batch handed to every
#: replica by ``strategy.run``: each adds the example's clipped gradient more than once).
WEIGHTS_FIXED = (
    "per-example weights (fit's class_weight or sample_weight, or weights in the dataset): set without the "
    "private records (weights computed from them, such as balanced class weights from the private labels, "
    "change with one record and rescale the other records' gradients before clipping, which the epsilon "
    "does not cover)")
#: The statement's ``asserted_by_user`` entry of a custom loop: the records its ledger release names.
CUSTOM_LOOP_RECORDS = (
    "custom training loop: the batches its steps hand the DP mechanism hold only records of the input given "
    "to begin_training (x, or the records record_ids name), against which the per-record ledger counts every "
    "step; nothing checks the loop's batches against them")
CUSTOM_LOOP_ROWS = (
    "custom training loop: each example is in at most one row of the batch a step hands the DP mechanism, "
    "and under a tf.distribute strategy in one replica's batch only (rows of one example, such as augmented "
    "copies, or one batch given to every replica would add its clipped gradient more than once a step)")


def _outermost_function_graph():
    """The graph of the outermost function being traced (a control-flow branch or nested function's)."""
    graph = tf.compat.v1.get_default_graph()
    while hasattr(getattr(graph, "outer_graph", None), "outer_graph"):
        graph = graph.outer_graph
    return graph


def _replica_id(context) -> int | None:
    """The replica's static id in a ``tf.distribute`` replica ``context`` (None: none, or not static)."""
    replica = None if context is None else tf.get_static_value(context.replica_id_in_sync_group)
    return None if replica is None else int(replica)


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _caller_outside_tfdpbnn() -> tuple:
    """``(file, line)`` of the innermost frame outside the tfdpbnn package: the code asking for a write."""
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE + os.sep):
        frame = frame.f_back
    return (None, None) if frame is None else (frame.f_code.co_filename, frame.f_lineno)


def _check_accountable(accountant, sampling, neighboring, sample_rate) -> None:
    """Refuse a (sampling, neighboring) pair the accountant cannot bound, before any step is taken."""
    import dp_accounting

    from tfdpbnn import privacy

    try:
        privacy.compute_epsilon(1.0, sample_rate, 1, 1e-5, accountant=accountant, neighboring=neighboring,
                                sampling=sampling)
    except dp_accounting.UnsupportedEventError as err:
        raise ValueError(
            f"neighboring: accountant {accountant!r} cannot bound sampling={sampling!r} under "
            f"neighboring={neighboring!r} ({err}); use neighboring='add_or_remove' or sampling='shuffle'"
        ) from err


def _runs_eagerly(model) -> bool:
    """Whether ``model``'s train function runs its step's Python code at every step (no trace).

    ``model.run_eagerly`` (Keras 2's also follows ``tf.config.run_functions_eagerly``; Keras 3's does not,
    but its step, a ``tf.function``, then runs eagerly all the same).
    """
    return bool(getattr(model, "run_eagerly", False)) or tf.config.functions_run_eagerly()


@contextlib.contextmanager
def _metrics_set_back(model):
    """Set ``model``'s metric objects back to their values before the block, read and written eagerly.

    A check's or a probe's synthetic batch passes through the model (``add_metric``, a ``train_step``
    override's own trackers): the metrics the real steps accumulate keep what those steps gave them. Not
    under a ``tf.distribute`` strategy (sum-aggregated metric variables take no cross-replica assign).
    """
    kept = [] if tf.distribute.has_strategy() else [
        v for metric in _private_api.metric_objects(model) for v in metric.variables]
    with tf.init_scope():  # at a trace too
        snapshot = state_checks.VariableSnapshot(model, variables=kept)
    try:
        yield
    finally:
        with tf.init_scope():
            snapshot.restore()


def _in_a_thread_of_its_own(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` in a new thread, waited for: eager, out of the scopes of a trace under way.

    The checks run at a trace as at a run's start: ``tf.init_scope`` would pause their gradient tapes, and
    with them their derivative checks. ``fn``'s exception is raised here.
    """
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tfdpbnn-check") as pool:
        return pool.submit(fn, *args, **kwargs).result()


def _build_sequential_holding_dp_preprocessing(model, x, y) -> None:
    """Build a ``Sequential`` with no ``Input`` that holds a DP-adapted layer, on the inputs' shape.

    The preprocessing check reads how many values one example feeds such a layer from its symbolic calls
    (``tfdpbnn.preprocessing.checks``), which Keras makes when it builds the model (as ``fit`` would at its
    first call); a model of several inputs, or another kind, is left as it is.
    """
    if getattr(model, "built", True) or not isinstance(model, tf.keras.Sequential) or not any(
            attributes.preprocessing_record(layer) is not None for layer in model.layers):
        return
    spec = fit_checks.element_specs(x, y)[0]
    if isinstance(spec, tf.TensorSpec) and spec.shape.rank:
        model.build(tf.TensorShape([None, *spec.shape[1:]]))


def _check_data_independent_losses(model, submodules=None) -> None:
    """``model.losses`` skip clipping, so none may depend on the data: refuse activity regularizers.

    ``submodules``: ``_private_api.submodules(model)`` when the caller has just walked the model.
    """
    for layer in _private_api.submodules(model) if submodules is None else submodules:
        if getattr(layer, "activity_regularizer", None) is not None:
            raise ValueError(
                f"model: layer {layer.name!r} has an activity_regularizer, a loss on the layer's outputs "
                "that depends on the private examples; DP optimizers add model.losses unclipped, so it "
                "would break the guarantee. Remove it (or put the term into the compiled per-example loss).")


class _RecordedDPGradients(DPGradients):
    """``DPGradients`` whose update direction is recorded as released when it is read."""

    @property
    def gradients(self):
        grads = super().gradients
        self._record(grads)
        return grads


class _OptimizerMechanism(DPMechanism):
    """An optimizer's ``DPMechanism`` that records each release (``DPOptimizerMixin.apply_gradients``)."""

    def __init__(self, *args, record, probe, user_loss, traced, **kwargs):
        super().__init__(*args, **kwargs)
        self._record = record
        self._probe = probe
        self._user_loss = user_loss
        self._traced = traced  # at a trace of clip_model: the model's checks as the trace finds it

    def clip_losses(self, per_example_loss, var_list, tape):
        """``DPMechanism.clip_losses``; while the optimizer probes a ``train_step``, the loss is checked."""
        probe = self._probe()
        if probe is not None:
            probe(per_example_loss, tape, "optimizer.mechanism.clip_losses")
        else:
            self._user_loss("optimizer.mechanism.clip_losses")
        return super().clip_losses(per_example_loss, var_list, tape)

    def clip_model(self, model, x, y, sample_weight=None, *, loss_fn=None, var_list=None, training=True):
        """``DPMechanism.clip_model``; while the optimizer probes a ``train_step``, ``loss_fn`` is checked.

        At a trace (``dp_train_step``, a custom loop's ``tf.function``) and at a step that runs eagerly
        (``run_eagerly``, a custom loop without ``tf.function``), the model is checked as the step finds it
        (``DPOptimizerMixin._check_traced_step``).
        """
        probe = self._probe()
        if probe is not None:
            if loss_fn is None:  # the compiled loss: fit_checks.check_per_example has checked it
                raise fit_checks.ProbeReached("optimizer.mechanism.clip_model")
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=training), sample_weight)
            probe(loss, tape, "optimizer.mechanism.clip_model(loss_fn=...)")
        else:
            if loss_fn is not None:
                self._user_loss("optimizer.mechanism.clip_model(loss_fn=...)")
            self._traced(model, x, y)  # at a trace, or at a step that runs eagerly
        return super().clip_model(model, x, y, sample_weight, loss_fn=loss_fn, var_list=var_list,
                                  training=training)

    def release(self, clipped):
        released = super().release(clipped)
        self._record(released.noised_gradients)
        result = _RecordedDPGradients(released.noised_gradients, released.regularization_gradients,
                                      released.clipped)
        result._record = self._record
        return result


def _check_release(value):
    """``release_training_metrics`` as False, True or a sorted list of metric names."""
    if value is None or value is False:
        return False
    if value is True:
        return True
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list | tuple) or not names or \
            not all(isinstance(n, str) and n for n in names):
        raise ValueError("release_training_metrics must be False, True or metric names such as "
                         f"('loss', 'accuracy'), got {value!r}")
    return sorted(set(names))




class _LedgerLink:
    """A plain (not trackable) holder of the optimizer that last trained a model: the model's ledger."""

    def __init__(self, optimizer):
        self.optimizer = optimizer


def _loss_assertions_from(saved) -> list:
    """The user's assertions in a saved optimizer's ``privacy_ledger`` config (checked)."""
    if not isinstance(saved, list | tuple) or not all(isinstance(a, str) and a.strip() for a in saved):
        raise ValueError("privacy_ledger['loss_assertions'] must be a list of non-empty strings (the "
                         f"assertions a saved optimizer carried), got {saved!r}")
    return list(saved)


def _written_outside_dp_from(saved) -> list:
    """The variables a saved optimizer found written outside its DP steps (``privacy_ledger``, checked)."""
    if not isinstance(saved, list | tuple) or not all(isinstance(n, str) and n for n in saved):
        raise ValueError("privacy_ledger['written_outside_dp'] must be a list of variable names (those a "
                         f"saved optimizer found written outside its DP steps), got {saved!r}")
    return list(saved)


class DPOptimizerMixin:
    """DP-SGD step, accounting state and privacy statement shared by every tfdpbnn DP optimizer.

    Args:
      l2_norm_clip: clip bound C > 0 on each example's data-loss gradient norm.
      noise_multiplier: sigma >= 0 (noise std sigma*C on the clipped sum). Give it, OR a budget.
      target_epsilon, delta: a budget; sigma is then calibrated with ``tfdpbnn.privacy.calibrate_noise`` for
        ``epochs`` epochs of ``ceil(num_examples / batch_size)`` steps, and training stops before a step
        that would exceed it (unless ``allow_exceeding_budget``). With ``noise_multiplier`` also given,
        ``target_epsilon`` is only the budget (no calibration). ``delta`` is also the delta the privacy
        statement reports. (``epsilon`` is never the budget: on ``DPAdamOptimizer`` it is Adam's own.)
      num_examples: n, the training set size (sample rate q = batch_size / n); checked against the data.
      batch_size: the EXPECTED batch size B (Poisson) or the batch size (shuffle); the noised sum is divided
        by it, never by the realized size.
      epochs: training length used for calibration.
      accountant: a SOUND ``tfdpbnn.privacy`` accountant name ("rdp" default); approximate accountants
        ("gdp") appear beside it in the privacy statement, labelled, never as the statement.
      sampling: "shuffle" (passes over the data: ``model.fit`` on arrays, or an asserted pipeline; accounted
        without amplification from the counted participations) or "poisson"
        (``tfdpbnn.data.poisson_batches``).
      neighboring: "add_or_remove" or "replace_one".
      clipping_method: forwarded to ``tfdpbnn.clipping.clipped_gradients``.
      secure_mode: draw every step's noise from a generator seeded with 16 bytes of ``os.urandom``
        (as Opacus's ``secure_mode``), so no seed set in the process can replay it
        (``tfdpbnn.privacy.noise``); default False: a Philox stream keyed by 16 bytes of ``os.urandom``
        drawn at every ``fit``/``train_on_batch``/``begin_training``, also independent of every seed.
      debug_noise_seed: None (default), or an integer in [0, 2^63): the noise is replayable from it, for
        debugging only. Whoever knows the seed can remove the noise, so the privacy statement says
        ``"guarantee": false`` and why (its epsilon values are then not guarantees). Saved by
        ``get_config``; not with ``secure_mode=True``.
      allow_exceeding_budget: with a budget, keep training past it (the statement then reports the larger
        epsilon); default False: training stops before the step that would exceed it.
      release_training_metrics: which training-batch metrics a DP ``fit`` passes to its callbacks
        (``History``, the progress bar, ``TensorBoard``, yours): they are computed on the private batches
        without noise, so no epsilon covers them. Default False: none (the logs hold epsilon and the
        validation metrics); True: all; or the names, e.g. ``("loss", "accuracy")``. Released metrics are
        named in the privacy statement's ``not_covered``. Metrics not released are not computed by the DP
        step, and the metric objects they live in are reset inside it (``model.get_metrics_result()`` and
        ``model.metrics`` hold nothing of the training batches; ``train_on_batch`` returns only released
        ones).
      initial_steps: steps already taken (``get_config`` records ``optimizer.iterations``).
      privacy_ledger: the ledger of a saved optimizer (``get_config`` records it).
      **kwargs: the base Keras optimizer's arguments (learning_rate, momentum, clipnorm, ...).
    """

    _dp_method = "DP-SGD"
    _DP_KEYS = ("l2_norm_clip", "noise_multiplier", "delta", "num_examples", "batch_size", "epochs",
                "accountant", "sampling", "neighboring", "clipping_method")

    def __init__(self, l2_norm_clip, noise_multiplier=None, *, target_epsilon=None, delta=None,
                 num_examples=None, batch_size=None, epochs=None, accountant="rdp", sampling="shuffle",
                 neighboring="add_or_remove", clipping_method="auto", allow_exceeding_budget=False,
                 secure_mode=False, debug_noise_seed=None,
                 initial_steps=0, privacy_ledger=None, release_training_metrics=False, **kwargs):
        if "epsilon" in kwargs:
            raise ValueError(
                f"epsilon: {type(self).__name__} has no 'epsilon' argument; the privacy budget is "
                f"target_epsilon=... (with delta=...), got epsilon={kwargs['epsilon']!r}")
        if kwargs.get("gradient_accumulation_steps") not in (None, 1):
            raise ValueError(
                f"gradient_accumulation_steps: {type(self).__name__} takes one DP step (one noised sum, "
                "counted in the privacy ledger) per batch, and Keras's accumulation would count its steps "
                "apart from the batches; got gradient_accumulation_steps="
                f"{kwargs['gradient_accumulation_steps']!r}. Use a larger batch_size instead (the same "
                "update with less noise per example)")
        if "adam_epsilon" in kwargs:  # DPAdamOptimizer's ``epsilon`` (Adam's own), passed on under its name
            kwargs["epsilon"] = kwargs.pop("adam_epsilon")
        clip = check_positive("l2_norm_clip", l2_norm_clip)
        if batch_size is None:
            raise ValueError("batch_size is required: the expected batch size B the noised sum is divided by")
        batch_size = check_positive_int("batch_size", batch_size)
        if num_examples is None:
            raise ValueError("num_examples is required: the training set size n, for the sample rate B/n")
        num_examples = check_positive_int("num_examples", num_examples)
        if batch_size > num_examples:
            raise ValueError(f"batch_size must be <= num_examples ({num_examples}), got {batch_size}")
        sampling = check_choice("sampling", sampling, SAMPLINGS)
        neighboring = check_choice("neighboring", neighboring, tuple(NEIGHBORING))
        clipping_method = check_choice("clipping_method", clipping_method, CLIPPING_METHODS)
        if accountant not in sound_accountants():
            raise ValueError(
                f"accountant must be one of the sound accountants {sound_accountants()}, got {accountant!r}; "
                "an approximate accountant (e.g. 'gdp', a central-limit approximation under subsampling) "
                "cannot give the printed epsilon. privacy_statement() lists it beside, labelled.")
        if delta is not None:
            delta = check_open_unit("delta", delta)
        if epochs is not None:
            epochs = check_positive_int("epochs", epochs)
        if not isinstance(secure_mode, bool):
            raise ValueError(f"secure_mode must be True or False, got {secure_mode!r}")
        debug_noise_seed = check_debug_noise_seed(debug_noise_seed, secure_mode)
        if not isinstance(allow_exceeding_budget, bool):
            raise ValueError(f"allow_exceeding_budget must be True or False, got {allow_exceeding_budget!r}")
        initial_steps = check_nonnegative_int("initial_steps", initial_steps)
        if noise_multiplier is None and target_epsilon is None:
            raise ValueError(
                "noise_multiplier and target_epsilon: give noise_multiplier=sigma, or a budget "
                "target_epsilon=..., delta=... with num_examples, batch_size, epochs; got neither")
        sample_rate = batch_size / num_examples
        _check_accountable(accountant, sampling, neighboring, sample_rate)
        if target_epsilon is not None:
            target_epsilon = check_positive("target_epsilon", target_epsilon)
            if delta is None:
                raise ValueError("delta is required with target_epsilon (a budget is (epsilon, delta)), got "
                                 "None")
            if noise_multiplier is None:
                if epochs is None:
                    raise ValueError("epochs is required with target_epsilon: calibration needs the number "
                                     "of steps")
                noise_multiplier = self._calibrate_noise_multiplier(
                    target_epsilon, delta, sample_rate, epochs * steps_per_epoch(batch_size / num_examples),
                    accountant, neighboring, sampling)
        noise_multiplier = check_nonnegative("noise_multiplier", noise_multiplier)
        super().__init__(l2_norm_clip=clip, noise_multiplier=noise_multiplier, num_microbatches=None,
                         unconnected_gradients_to_zero=True, **kwargs)
        self._dp_static = {"delta": None if delta is None else float(delta), "num_examples": num_examples,
                           "epochs": epochs, "accountant": accountant, "sampling": sampling,
                           "neighboring": neighboring, "clipping_method": clipping_method,
                           "target_epsilon": target_epsilon, "allow_exceeding_budget": allow_exceeding_budget,
                           "secure_mode": secure_mode, "debug_noise_seed": debug_noise_seed,
                           "release_training_metrics": _check_release(release_training_metrics)}
        self._dp_checked_models = set()
        self._dp_fresh_checks = {}  # (model, loss) checked in this run -> DP writes when it was checked
        self._dp_check_every_trace = False  # a custom loop: each trace checks the model
        self._dp_override_run = None  # this run's train_step override to probe at traces (_check_model)
        # id(model) -> [(variable, its value at the model's last check)]: what its forward pass, losses and
        # loss read that is not its own (outside_reads), watched during runs and checked again when changed
        self._dp_foreign_variables = {}
        self._dp_public_variables = {}  # id(tf.Variable) -> reason (assert_public_variable)
        self._dp_unkept_reads = set()  # id(model) of models whose outside reads cannot all be kept
        self._dp_inherited_from = weakref.WeakSet()  # optimizers whose writes it took (_inherit_unguaranteed)
        self._dp_compiled_model = None  # weak reference to the model a compile gave it (_note_compiled_model)
        self._dp_run_specs = None  # the element specs of the run's inputs, for checks during the run
        self._dp_probe = None  # a fit_checks.LossProbe while a train_step override is probed
        # The DP writes traced in each graph of a fit's step, by replica (_refuse_second_write_in_step), and
        # those of an eager fit's steps since the monitor's last batch start, with how many steps that is.
        self._dp_writes_per_trace = weakref.WeakKeyDictionary()
        self._dp_write_sites = weakref.WeakKeyDictionary()  # outermost graph -> {replica: lines that write}
        # (id(input), replica) -> the input a replica clipped (_refuse_batch_given_to_every_replica), held
        # weakly: an id reused by a new tensor after the old one is gone is not taken for it.
        self._dp_replica_inputs: weakref.WeakValueDictionary[tuple, tf.Tensor] = weakref.WeakValueDictionary()
        self._dp_eager_step_writes, self._dp_eager_step_limit = {}, None
        with tf.init_scope():
            self._dp_noise_multiplier = self._dp_variable("dp_noise_multiplier", noise_multiplier)
            self._dp_l2_norm_clip = self._dp_variable("dp_l2_norm_clip", clip)
            self._dp_batch_size = self._dp_variable("dp_batch_size", float(batch_size))
            self._dp_sample_rate = self._dp_variable("dp_sample_rate", sample_rate)
            # Create the step counter now (Keras creates it lazily); a restored optimizer starts from the
            # steps already taken (Keras's SavedModel loader rebuilds optimizers from config only).
            self.iterations.assign(initial_steps)
            # The DP writes this optimizer applied: only its apply_gradients adds to it (a restore of the
            # optimizer's variables sets it back with the rest). The write watch compares it, not
            # ``iterations``, which code may set (``iterations.assign(0)``) to pass a write off as a restore.
            self._dp_write_count = self.add_weight(
                "dp_write_count", shape=[], dtype=tf.float64, trainable=False,
                initializer=tf.keras.initializers.Constant(float(initial_steps)),
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
            attributes.set_ledger_state(self, LedgerState(self, privacy_ledger))
            attributes.ledger_state(self).read_with([self._dp_noise_multiplier, self._dp_batch_size])
            attributes.ledger_state(self).guard_variable(self._dp_write_count)
        keras_integration.install()
        self._dp_released = []
        self._dp_batch_call_limit = None
        attributes.attach_run_record(self, RunRecord(self))  # the run record, and no other releases yet
        self._dp_in_fit = 0  # > 0 while model.fit runs this optimizer (keras_integration)
        self._dp_write_watch = state_checks.WriteWatch()  # writes to the weights between DP steps
        self._dp_write_watch.taint(_written_outside_dp_from((privacy_ledger or {}).get("written_outside_dp",
                                                                                         [])))
        self._dp_loss_assertion = None  # begin_training(assert_per_example_loss=...) of the open custom loop
        # every such assertion (the statement's asserted_by_user), a saved optimizer's too (get_config)
        attributes.set_loss_assertions(self, _loss_assertions_from((privacy_ledger or {}).get(
            "loss_assertions", [])))
        for kind in (privacy_ledger or {}).get("not_covered", []):  # a saved optimizer's releases
            self.note_uncovered_release(kind)
        self._restore_releases(privacy_ledger or {})
        self.mechanism = _OptimizerMechanism(
            self._dp_l2_norm_clip, self._dp_noise_multiplier, self._dp_batch_size, scale=self._dp_sum_scale,
            clipping_method=clipping_method, secure_mode=secure_mode,
            debug_noise_seed=self._dp_static["debug_noise_seed"], neighboring=neighboring,
            on_batch=self._dp_count_batch, record=self._dp_record_release, probe=lambda: self._dp_probe,
            user_loss=self._dp_require_loss_checked, traced=self._check_traced_step)

    # ----------------------------------------------------------------------------------------- state
    def _f32(self, variable):
        """A float64 accounting variable as the float32 the training graph uses."""
        return tf.cast(variable, tf.float32)

    def _dp_variable(self, name, value, dtype=tf.float64):
        return self.add_weight(name, shape=[], dtype=dtype, initializer=tf.keras.initializers.Constant(value),
                               trainable=False)

    def _calibrate_noise_multiplier(self, epsilon, delta, sample_rate, steps, accountant, neighboring,
                                    sampling):
        from tfdpbnn import privacy

        return float(privacy.calibrate_noise(epsilon, delta, sample_rate, steps, accountant=accountant,
                                             neighboring=neighboring, sampling=sampling))

    def _dp_setting(self, variable):
        """A DP setting's variable, read once per ledger ``reading_once`` block (``LedgerState.read``).

        A block runs no step and no restore, so nothing changes the setting within it; outside one (or
        before the ledger exists) every call reads the variable.
        """
        state = attributes.ledger_state(self)
        return _private_api.read_numpy(variable) if state is None else state.read(variable)

    @property
    def noise_multiplier(self) -> float:
        """sigma: the DP-SGD noise multiplier the accounting uses."""
        return float(self._dp_setting(self._dp_noise_multiplier))

    @property
    def l2_norm_clip(self) -> float:
        """C: the per-example clip bound."""
        return float(_private_api.read_numpy(self._dp_l2_norm_clip))

    @property
    def batch_size(self) -> int:
        """B: the expected batch size."""
        return int(round(float(self._dp_setting(self._dp_batch_size))))

    @property
    def sample_rate(self) -> float:
        """q = B / n."""
        return self.batch_size / self.num_examples

    @property
    def num_examples(self) -> int:
        """n: the training set size the accounting assumes (checked against the data by ``fit``)."""
        return self._dp_static["num_examples"]

    @property
    def sampling(self) -> str:
        """"poisson" or "shuffle"."""
        return self._dp_static["sampling"]

    @property
    def neighboring(self) -> str:
        """"add_or_remove" or "replace_one"."""
        return self._dp_static["neighboring"]

    @property
    def accountant(self) -> str:
        """The sound accountant that gives the printed epsilon."""
        return self._dp_static["accountant"]

    @property
    def delta(self):
        """The delta of the privacy statement (None if not given)."""
        return self._dp_static["delta"]

    @property
    def target_epsilon(self):
        """The (epsilon) budget this optimizer carries, or None."""
        return self._dp_static["target_epsilon"]

    @property
    def steps(self) -> int:
        """DP steps taken so far by this optimizer (its count of DP writes).

        Equal to ``optimizer.iterations`` unless code set that counter, which the budget never reads.
        """
        return int(_private_api.read_numpy(self._dp_write_count))

    @property
    def ledger(self):
        """The ``tfdpbnn.privacy.PrivacyLedger`` of everything this model's training ran so far."""
        return attributes.ledger_state(self).ledger()

    def get_config(self):
        """The Keras config plus every DP setting, the steps taken and the privacy ledger."""
        config = super().get_config()
        config.update(self._dp_static)
        config.update({"l2_norm_clip": self.l2_norm_clip, "noise_multiplier": self.noise_multiplier,
                       "batch_size": self.batch_size, "initial_steps": self.steps,
                       "privacy_ledger": {**attributes.ledger_state(self).to_config(),
                                          "not_covered": sorted(attributes.uncovered(self)),
                                          **self._releases_config()}})
        if attributes.loss_assertions(self):  # the phases they vouch for travel in the same config
            config["privacy_ledger"]["loss_assertions"] = list(attributes.loss_assertions(self))
        written = self._dp_note_unguaranteed()[0]
        if written:  # what no epsilon covers travels with the phases: a loaded optimizer gives no guarantee
            config["privacy_ledger"]["written_outside_dp"] = written
        return config

    def _releases_config(self) -> dict:
        """The recorded releases, search record and DP preprocessing, as ``get_config`` carries them."""
        from tfdpbnn.record.other_releases import release_config, search_config

        config = {}
        if attributes.releases(self):
            config["releases"] = [
                release_config(r, how, attributes.parallel_basis(self).get(id(r)),
                               *attributes.release_ledger(self).get(id(r), (None, False, None)),
                               checked_at=attributes.parallel_keys(self).get(id(r), (None,))[0],
                               asserted_training_records=attributes.training_records_asserted(self).get(id(r)))
                for r, how in attributes.releases(self)]
        search = search_config(attributes.search_record(self))
        if search is not None:
            config["search"] = search
        found = attributes.preprocessing_found(self)
        if found and (found["dp"] or found["asserted_public"]):  # every DP preprocessing release composed
            config["preprocessing"] = {"dp": [r.to_config() for r in found["dp"]],
                                       "asserted_public": [dict(a) for a in found["asserted_public"]]}
        return config

    def _restore_releases(self, config: dict) -> None:
        """Take back the releases, search record and DP preprocessing of a saved ``privacy_ledger`` config."""
        from tfdpbnn.record.other_releases import release_from_config, search_from_config

        for item in config.get("releases", []):
            release = release_from_config(item)
            attributes.releases(self).append((release, item["composition"]))
            if item["composition"] == "parallel":
                attributes.parallel_basis(self)[id(release)] = item["basis"]
                if item.get("checked_at") is not None:  # checked when the training was this far
                    attributes.parallel_keys(self)[id(release)] = (tuple(item["checked_at"]), None)
            if item.get("asserted_training_records") is not None:
                attributes.training_records_asserted(self)[id(release)] = str(
                    item["asserted_training_records"])
            if item.get("ledger_release") is not None:
                attributes.release_ledger(self)[id(release)] = (int(item["ledger_release"]),
                                                                bool(item.get("on_training_records")),
                                                                item.get("ledger_token") or None)
        search = search_from_config(config.get("search"))
        if search is not None:
            attributes.set_search_record(self, search)
        preprocessing = config.get("preprocessing")
        if preprocessing is not None:
            from tfdpbnn.record.preprocessing import PreprocessingRecord

            if not isinstance(preprocessing, dict) or not isinstance(preprocessing.get("dp", []), list) or \
                    not isinstance(preprocessing.get("asserted_public", []), list):
                raise ValueError("privacy_ledger['preprocessing'] must be a dict with the lists 'dp' and "
                                 f"'asserted_public' (as get_config writes it), got {preprocessing!r:.200}")
            try:
                records = [PreprocessingRecord.from_config(c) for c in preprocessing.get("dp", [])]
            except ValueError as err:
                raise ValueError(f"privacy_ledger['preprocessing']: {err}") from err
            attributes.add_preprocessing_found(
                self, {"dp": records, "asserted_public": list(preprocessing.get("asserted_public", []))})

    def _import_linked_releases(self, ledger_of=None) -> int:
        """Add the per-record ledger's releases that name this model's training phases and are missing here.

        A private temperature recorded by an earlier optimizer of these weights (in another process, before
        ``load_weights``, ...) is found so; it is composed sequentially (an upper bound: a parallel split is
        not re-checked). Returns how many were added. ``ledger_of``: a function giving the per-record ledger
        (the caller's, opened once for its transaction), else ``record_ledger.default_ledger``.
        """
        from tfdpbnn.record.other_releases import RestoredRelease
        from tfdpbnn.record.private_release import PrivacyCost
        from tfdpbnn.record.record_ledger import default_ledger, event_to_config

        phase_ids = [p.phase_id for p in self.ledger.phases if p.released]
        ledger = (ledger_of or default_ledger)() if phase_ids else None
        if ledger is None:
            return 0
        held = {entry[0] for entry in attributes.release_ledger(self).values()}
        added = 0
        for found in ledger.linked_releases(phase_ids):
            if found.release_id in held or found.kind == "search":
                continue  # a search's scores: in the ledger bound, and in the search record the model carries
            cost = PrivacyCost(mechanism=found.kind, dp_event=found.event(), epsilon=math.nan, delta=0.0,
                               neighboring=found.neighboring)
            release = RestoredRelease(privacy=cost, ledger_release=found.release_id, record={
                "imported_from_ledger": found.release_id, "description": found.description,
                "dp_event": event_to_config(found.event()),
                "note": "found in the per-record ledger by this model's training phases; composed "
                        "sequentially"})
            attributes.releases(self).append((release, "sequential"))
            # in the ledger's histories
            attributes.release_ledger(self)[id(release)] = (found.release_id, True, found.token)
            added += 1
        return added

    # ------------------------------------------------------------------------------------ accounting
    def _resolve_delta(self, delta):
        delta = self.delta if delta is None else delta
        if delta is None:
            raise ValueError("delta: pass delta=... here or to the optimizer's constructor")
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta!r}")
        return float(delta)

    def _resolve_accountant(self, accountant):
        accountant = self.accountant if accountant is None else accountant
        if accountant not in sound_accountants():
            raise ValueError(
                f"accountant must be one of the sound accountants {sound_accountants()}, got {accountant!r}; "
                "approximations are listed separately in privacy_statement()['approximate_epsilon']")
        return accountant

    def _dp_phase_override(self, description, steps):
        """A ``Phase`` replacing the DP-SGD phase for ``description`` (SI-DPSGD's paper mode), or None."""
        return None

    def _dp_steps_accounted_as_dp_sgd(self) -> bool:
        """Whether every step is accounted as DP-SGD's (``_dp_phase_override`` replaces none of them)."""
        return True

    def _dp_uncovered_weights(self, phase_id):
        """``(phase, variables)`` when the weights now are covered by no epsilon (SI-DPSGD's mean), or None.

        The record's snapshot of them then holds ``phase`` (a release without noise) beside their ledger.
        """
        return None

    def _dp_continues_uncovered(self, phase, held_ids) -> bool:
        """Whether ``phase`` (``_dp_uncovered_weights``) is this optimizer's own, its accounting going on."""
        return False

    def epsilon_after(self, steps, delta=None, accountant=None) -> float:
        """Planning: epsilon of ``steps`` steps of this optimizer's DECLARED mechanism from scratch.

        Poisson: ``steps`` subsampled Gaussians at q = B/n; shuffle: ``ceil(steps / ceil(n/B))`` passes. What
        really ran is ``epsilon()``.
        """
        from tfdpbnn import privacy

        delta = self._resolve_delta(delta)
        accountant = self._resolve_accountant(accountant)
        if steps <= 0:
            return 0.0
        sigma = self.noise_multiplier
        if sigma == 0:
            return math.inf
        return float(privacy.compute_epsilon(sigma, self.sample_rate, int(steps), delta,
                                             accountant=accountant, neighboring=self.neighboring,
                                             sampling=self.sampling))

    def epsilon(self, delta=None, accountant=None) -> float:
        """Epsilon spent by everything this model's DP training ran (the ledger), an upper bound.

        Before this optimizer's first run, the training the weights of the model compiled with it carry.

        Composed with the model's DP preprocessing releases and the search that selected it, if any
        (``tfdpbnn.record.other_releases``; a search's bound is by RDP whatever ``accountant``).
        """
        from tfdpbnn.record.other_releases import composed_epsilon

        settle_open_loops()  # what the custom loops of this process spent, in the per-record ledger
        compiled = self._compiled_model() if attributes.run_record(self).model() is None else None
        if compiled is not None:  # no run yet: what the weights of the model compiled with it carry
            attributes.run_record(self).adopt(compiled)
            self._import_model_training(compiled)
        return composed_epsilon(self, self.ledger, self._resolve_delta(delta),
                                self._resolve_accountant(accountant))

    def _epsilon_if(self, extra_steps, delta, accountant=None) -> float:
        """Epsilon if the open phase ran ``extra_steps`` more steps of expected batch size B.

        A plan, for the budget's stopping point: replayable noise (``debug_noise_seed``) is planned as if
        secret, so a debugging run stops where the same run with secret noise would (every epsilon it
        reports is infinite).
        """
        state = attributes.ledger_state(self)
        if state.open_description() is None:  # no fit opened a phase: the declared mechanism's steps
            ledger = state.ledger().with_secret_noise()
            if extra_steps > 0:
                ledger.add(self._declared_phase(int(extra_steps)))
        else:
            steps, examples, _ = state.open_counters()
            ledger = state.ledger(steps=steps + extra_steps,
                                  examples=examples + extra_steps * self.batch_size).with_secret_noise()
        from tfdpbnn.record.other_releases import composed_epsilon

        return composed_epsilon(self, ledger, delta, self._resolve_accountant(accountant))

    def _declared_phase(self, steps: int) -> Phase:
        """A plan: ``steps`` steps of the declared mechanism (as ``epsilon_after`` counts them), as a phase.

        Poisson: subsampled Gaussians at q = B/n; shuffle: ``ceil(steps / ceil(n/B))`` whole passes.
        """
        poisson = self.sampling == "poisson"
        description = {"kind": "poisson" if poisson else "shuffle", "noise_multiplier": self.noise_multiplier,
                       "neighboring": self.neighboring, "sample_rate": self.sample_rate if poisson else None,
                       "num_examples": self.num_examples, "source": "poisson_batches" if poisson
                       else "keras_arrays", "batch_size": float(self.batch_size)}
        passes = math.ceil(steps / math.ceil(self.num_examples / self.batch_size))
        examples = steps * self.batch_size if poisson else passes * self.num_examples
        return planned_phase(description, steps, examples, self._dp_phase_override)

    def privacy_statement(self, delta=None, model=None) -> dict:
        """What a reader needs to check the guarantee; ``tfdpbnn.export_saved_model`` saves it as JSON.

        ``epsilon`` is the sound accountant's bound for every phase of this model's training
        (``phases``: what was counted and whether the sampling was verified or asserted by the user);
        ``approximate_epsilon`` lists approximations beside it, which are not guarantees. ``spent`` is
        everything the record holds (it is append-only: steps after the weights in hand stay), ``weights``
        the training behind the weights in hand of ``model`` (default: the model this optimizer last
        trained, or else the model compiled with it; a model given here, or compiled with it before any run,
        first inherits its weights' record from the privacy record store).
        """
        self._dp_bookkeeping_written_between_runs("found by the privacy statement")
        return build_statement(self, self._resolve_delta(delta), model=self._import_weights_record(model))

    def _import_weights_record(self, model=None, adopt=False):
        """Import what the weights of ``model`` carry; returns the model a statement is of, or None.

        ``model``: default the model this optimizer last trained, or else the model compiled with it. Other
        optimizers' training and DP preprocessing are imported; with ``adopt``, a compiled model before any
        run is adopted as ``epsilon`` does (``RunRecord.adopt``: the releases linked to its training in the
        per-record ledger too).
        """
        target = model if model is not None else attributes.run_record(self).model()
        if target is None:  # no run yet: the model compiled with it, if any
            model = target = self._compiled_model()
            if adopt and target is not None:
                attributes.run_record(self).adopt(target)
        if target is not None:
            self._import_model_training(target)
        return model

    #: What a run can release beside the DP gradients, which no epsilon covers (``note_uncovered_release``).
    UNCOVERED_RELEASES = {
        "training_metrics": "loss and compiled metrics of the private training batches, computed without "
                            "noise, in the Keras logs (History, progress bar, TensorBoard), released by "
                            "release_training_metrics",
        "validation_split": "loss and metrics on the validation_split rows of the private arrays, computed "
                            "without noise, in the Keras logs",
        "validation_data": "loss and metrics on validation_data, computed without noise, in the Keras logs "
                           "(a release of private data if that data is private)",
    }

    @property
    def release_training_metrics(self):
        """Training-batch metrics a DP ``fit`` shows its callbacks: False (none), True (all) or names."""
        return self._dp_static["release_training_metrics"]

    def note_released_training_metrics(self) -> None:
        """Name the released training metrics (``release_training_metrics``) in the statement, if any."""
        released = self.release_training_metrics
        if released:
            self.note_uncovered_release("training_metrics")
            if released is not True:
                attributes.uncovered(self)["training_metrics"] += f": {', '.join(released)}"

    def note_uncovered_release(self, kind: str) -> None:
        """Record that this run released ``kind`` (a key of ``UNCOVERED_RELEASES``), for the statement."""
        attributes.uncovered(self)[check_choice("kind", kind, tuple(self.UNCOVERED_RELEASES))] = \
            self.UNCOVERED_RELEASES[kind]

    def record_release(self, release, composition="sequential", *, x=None, y=None, record_ids=None,
                       asserted_disjoint=None, asserted_training_records=None) -> None:
        """Compose a private release of this model's data into its privacy statement.

        ``release``: what a private fit on the private data returned, such as
        ``tfdpbnn.uncertainty.fit_temperature_private`` or ``private_conformal_threshold`` (anything with a
        ``privacy`` attribute holding a ``dp_event``, e.g. ``tfdpbnn.uncertainty.PrivacyCost``). From then on
        the statement's ``epsilon`` covers it (``training_epsilon`` keeps the training alone) and lists it
        under ``releases``. ``composition``: "sequential" (its event composed with the training ledger, one
        accountant) or "parallel" (fit on records held out of training by
        ``tfdpbnn.uncertainty.split_by_record``: the parallel releases are composed with each other and the
        statement takes the larger of that and the training's epsilon, McSherry 2009; add/remove adjacency
        only). Recording a release this optimizer holds already counts it once: the same object, or the same
        content (``as_dict()``) restored with a loaded model or imported from the per-record ledger.

        "parallel" is accepted only when the split is checked or asserted: with ``x``/``y`` or ``record_ids``
        the per-record ledger must show that none of those records was touched by this model's training
        (the records of a split the library made, ``split_by_record``); else ``asserted_disjoint`` (a
        non-empty reason) asserts the split by name, and the statement lists it under
        ``asserted_by_user``. Otherwise ``ValueError``: use "sequential".

        ``x``/``y`` (the data the release was fit on, in the form training was given it: ``x`` of another
        per-example shape than the model's input is refused) or ``record_ids`` (their ids; as many as the
        rows the release read, where it records their number as ``num_examples``): the release is also
        written to the per-record ledger (``tfdpbnn.record.record_ledger``)
        against exactly those records, so every later run on them counts it. This model's own
        ``ledger_bound`` composes it with the history of every record the model was trained on either way
        (an upper bound). A private release must name its records so (``y`` alone names none): one that
        names none is refused (``ValueError`` naming ``x``, ``y`` and ``record_ids``), since the ledger could
        not charge the records it read and a later run on them would quote an epsilon without it, unless
        ``asserted_training_records`` (a non-empty reason) asserts by name that it read only records this
        optimizer's training used: it is then written against every record of that training (refused when
        the ledger holds none), and the statement lists the assertion under ``asserted_by_user``. Only for
        "sequential", and not with records named. A release without privacy cost (a ``NoOpDpEvent``: a fit
        on public data) needs neither.

        The release has run already, so a per-record budget can refuse recording it, not computing it: give
        the private fit the optimizer instead (``fit_temperature_private(..., optimizer=...)``,
        ``private_conformal_threshold``, ``CalibrationPlan.fit``), which reserves it first
        (``reserve_release``).
        """
        import numbers

        import dp_accounting

        cost = getattr(release, "privacy", None)
        if not isinstance(getattr(cost, "dp_event", None), dp_accounting.DpEvent):
            raise ValueError("release must have a `privacy` attribute with a dp_accounting DpEvent (e.g. the "
                             "result of tfdpbnn.uncertainty.fit_temperature_private), got "
                             f"{type(release).__name__}")
        from tfdpbnn.record.private_release import held_release

        self._import_weights_record(adopt=True)  # the releases a loaded model's weights carry already
        if held_release(self, release) is None:  # recorded, restored or imported already: counted once
            read = getattr(release, "num_examples", None)  # the rows it read, where it records them
            self.reserve_release(cost, composition, x=x, y=y, record_ids=record_ids,
                                 asserted_disjoint=asserted_disjoint,
                                 asserted_training_records=asserted_training_records,
                                 records_read=read if isinstance(read, numbers.Integral) else None
                                 ).commit(release)

    def reserve_release(self, cost, composition="sequential", *, x=None, y=None, record_ids=None,
                        asserted_disjoint=None, asserted_training_records=None, records_read=None):
        """Check and reserve a private release of ``cost`` before it runs; returns its ``ReleaseReservation``.

        ``cost``: the release's ``PrivacyCost`` (its ``dp_event``), known before it reads its data; the
        other arguments as ``record_release``'s. The composition is checked and the planned event written
        to the per-record ledger now, so a per-record budget (``RecordLedger.set_budget``) refuses the
        release before it reads its data (``BudgetExceededError``; nothing written). Then
        ``reservation.commit(release)`` composes the release into this optimizer's statement. The private
        fits take the optimizer and do both (``fit_temperature_private(..., optimizer=...)``).

        ``records_read``: the number of rows the release reads (the private fits pass ``len(labels)``);
        records named (``x``/``record_ids``) in another number are refused (``ValueError`` naming ``x`` or
        ``record_ids`` and both counts): the ledger would charge records other than those read. None: not
        checked. ``x`` must be in the form training was given it (the model's per-example input shape, not,
        e.g., predicted probabilities): ``ValueError`` naming ``x`` otherwise, for either composition.
        """
        import dp_accounting

        from tfdpbnn.record.private_release import ReleaseReservation

        if not isinstance(getattr(cost, "dp_event", None), dp_accounting.DpEvent):
            raise ValueError("cost must have a dp_accounting DpEvent as `dp_event` (a "
                             f"tfdpbnn.uncertainty.PrivacyCost), got {type(cost).__name__}")
        check_choice("composition", composition, ("sequential", "parallel"))
        if composition == "parallel" and self.neighboring != "add_or_remove":
            raise ValueError(f"composition: parallel composition over a record-wise split needs add/remove "
                             f"adjacency, this optimizer uses {self.neighboring!r}; use 'sequential'")
        relation = getattr(cost, "neighboring", None)
        if relation is not None and relation != self.neighboring:
            raise ValueError(
                f"neighboring: the release's noise was calibrated to the sensitivity under {relation!r} and "
                f"this optimizer accounts under {self.neighboring!r} (replace-one doubles a sum's "
                "sensitivity): composed here its cost would be understated. Compute the release with "
                f"neighboring={self.neighboring!r} (the private fits given optimizer= take its relation).")
        named = x is not None or record_ids is not None
        if named and x is not None:
            self._check_release_input_shape(x)
        asserted = self._training_records_assertion(asserted_training_records, composition, named, y)
        keys = None
        if named:
            from tfdpbnn.record.records import record_keys

            keys = record_keys(x, y, record_ids)
            self._check_named_records(keys, x, record_ids, records_read)
        basis = None
        if composition == "sequential" and keys is not None and hasattr(keys, "content") \
                and keys.content is None:
            self._refuse_ids_unknown_to_the_ledger(keys)
        if composition == "parallel":
            basis = self._parallel_basis(keys, asserted_disjoint)
        elif asserted_disjoint is not None:
            raise ValueError("asserted_disjoint: only for composition='parallel', got it with "
                             f"composition={composition!r}")
        if keys is None and asserted is None and not isinstance(cost.dp_event, dp_accounting.NoOpDpEvent):
            raise ValueError(
                "x, y, record_ids: the release names none of the records it read (y= alone names none), so "
                "the per-record ledger cannot charge them, and a later run on them would quote an epsilon "
                "without this release. Name them: x= (with y=; the records in the form training was given "
                "them) or record_ids= (with x=, or ids the ledger knows). If it read only records this "
                "optimizer trained on, assert that by name with asserted_training_records='why' (composition "
                "'sequential'; listed under asserted_by_user, the release charged to every training record)")
        checked = keys if basis is not None and basis.startswith("checked") else None
        return ReleaseReservation(self, cost, composition, basis, self._reserve_in_ledger(cost, composition,
                                                                                          keys, asserted),
                                  checked, asserted)

    def _training_records_assertion(self, asserted, composition, named, y) -> str | None:
        """The reason of ``asserted_training_records`` (stripped), None when not given; checked first.

        It says that a release naming none of its records read only this optimizer's training records:
        a non-empty ``str``, for a "sequential" release that names no records (``ValueError`` otherwise).
        """
        if asserted is None:
            return None
        if not isinstance(asserted, str) or not asserted.strip():
            raise ValueError("asserted_training_records: a non-empty reason (str) why the release read only "
                             f"records this optimizer trained on, got {asserted!r}")
        if composition != "sequential":
            raise ValueError("asserted_training_records: a release on the training records is not disjoint "
                             "from them; it composes with composition='sequential', got "
                             f"composition={composition!r}")
        if named or y is not None:
            raise ValueError("asserted_training_records: asserts the records of a release that names none; "
                             "give x=/y=/record_ids= (its records, charged as named) or the assertion, not "
                             "both")
        return asserted.strip()

    def _reserve_in_ledger(self, cost, composition, keys, asserted=None):
        """Reserve a release of ``cost`` in the per-record ledger, linked to this model's training phases.

        Against ``keys`` when given; else against every record this model's training touched: the records
        the user asserted it read (``asserted``, the reason of ``asserted_training_records``; refused when the
        ledger holds none of them), or, for a release without privacy cost, the records whose guarantee it
        would count. Every later optimizer of weights from these phases finds it there
        (``_import_linked_releases``). Returns ``(reservation, phase ids, on the training records, token)``,
        or None when nothing is written (no ledger, no records).
        """
        from tfdpbnn.record.record_ledger import default_ledger, new_release_token

        ledger = default_ledger()
        if ledger is None:
            return None
        on_training = keys is None
        if on_training and asserted is not None:  # a model compiled with it: the training its weights carry
            model = attributes.run_record(self).model() or self._compiled_model()
            if model is not None:
                self._import_model_training(model)
        phase_ids = [p.phase_id for p in self.ledger.phases if p.released]
        if on_training:
            keys = ledger.training_keys(phase_ids) if phase_ids else None
            if keys is None or not len(keys):
                if asserted is not None:
                    raise ValueError(
                        "asserted_training_records: the per-record ledger holds no record of this "
                        "optimizer's training (no DP step yet, or its records were unknown: a tf.data "
                        "pipeline without record keys), so the release would be charged to no record; name "
                        "its records (x=, y= or record_ids=)")
                return None
        token = new_release_token()  # names this release in the histories that hold it (the ledger bound)
        description = f"{cost.mechanism} ({composition}) of {type(self).__name__}" + (
            "" if asserted is None else f", asserted to have read its training records: {asserted}")
        reservation = ledger.reserve(keys, cost.dp_event, kind="calibration", neighboring=self.neighboring,
                                     description=description, token=token)
        return reservation, [int(p) for p in phase_ids], on_training, token

    def _refuse_ids_unknown_to_the_ledger(self, keys) -> None:
        """Refuse a release named by ``record_ids`` alone whose ids the per-record ledger does not hold.

        Ids without their rows are matched only with the same ids in the ledger: where training named the
        same people by their rows' content (or by other ids), the release's history and theirs never meet,
        and a later run on those rows would compose none of it (7.08 quoted where 8.54 holds after two passes
        and a calibration). Ids the ledger holds (training named by the same ids) are accepted.
        """
        from tfdpbnn.record.record_ledger import default_ledger

        ledger = default_ledger()
        if ledger is None:
            return
        import numpy as np

        wanted = len(np.unique(np.asarray(keys)))
        held = sum(h.records for h in ledger.histories(keys) if h.releases)  # records new to it: none
        if held < wanted:
            raise ValueError(
                f"record_ids: {wanted - held} of the release's {wanted} records are named by ids the "
                "per-record ledger has never seen, given without their rows: the ledger cannot match them "
                "with records training named by their content or by other ids, so a later run on the same "
                "people would not compose this release. Pass the release's data (x=, y=) as training saw it "
                "with its record_ids, name training by the same record_ids, or, when the release read only "
                "the training records, leave record_ids out and assert that with asserted_training_records="
                "'why'")

    def _check_release_input_shape(self, x) -> None:
        """Refuse a release's ``x`` whose per-example shape is not this model's input shape (``ValueError``).

        The per-record ledger knows records by the rows training was given: a release named by another form
        of them (e.g. predicted probabilities) would be charged to records no run ever reads, so a later run
        on the real ones would quote an epsilon without it. Not checked when the model is unknown (no DP run
        yet) or takes several inputs.
        """
        record = attributes.run_record(self)
        model = record.model() if record is not None else None
        wanted = getattr(model, "input_shape", None) if model is not None else None
        got = tuple(x.shape) if hasattr(x, "shape") else None
        if got is not None and isinstance(wanted, tuple) and (len(got) != len(wanted) or any(
                a is not None and a != b for a, b in zip(wanted[1:], got[1:], strict=True))):
            raise ValueError(f"x: the release's records in the form training was given them (the model's "
                             f"input shape {wanted}), got shape {got}: the per-record ledger knows records "
                             "only in that form (not, e.g., as predicted probabilities), and would charge "
                             "records no run reads")

    @staticmethod
    def _check_named_records(keys, x, record_ids, records_read) -> None:
        """Refuse records named (``keys``, of ``x`` or ``record_ids``) in another number than the rows read.

        ``records_read``: the number of rows the release read (None: unknown, not checked).
        """
        if records_read is None:
            return
        named, read = len(keys), int(records_read)
        if named != read:
            name = "x" if x is not None else "record_ids"
            raise ValueError(f"{name}: names {named} records, but the release read {read} rows: the "
                             "per-record ledger would charge records other than those it read. Name exactly "
                             "the rows the fit read (the same rows as its labels), in the form training was "
                             "given them")

    def _parallel_basis(self, keys, asserted_disjoint) -> str:
        """Why a "parallel" release's records are disjoint from this model's training records, or raise.

        Checked in the per-record ledger when the release's records are known (``keys``), else asserted by
        the user (``asserted_disjoint``); the line goes into the statement.
        """
        if asserted_disjoint is not None:
            if not isinstance(asserted_disjoint, str) or not asserted_disjoint.strip():
                raise ValueError("asserted_disjoint: a non-empty reason (str) why the release's records are "
                                 f"disjoint from the training records, got {asserted_disjoint!r}")
            return f"asserted by the user: {asserted_disjoint.strip()}"
        how = ("pass the release's data (x=, y=) or record_ids= so the per-record ledger can check that no "
               "training record is among them, assert it by name with asserted_disjoint='why', or use "
               "composition='sequential'")
        if keys is None:
            raise ValueError(f"composition: 'parallel' needs the release's records to be disjoint from the "
                             f"training records, and nothing shows it; {how}")
        if hasattr(keys, "content") and keys.content is None:
            # Ids without their rows: the ledger compares them with the keys training wrote, which name the
            # same rows otherwise when training named them by content or by other ids (no overlap found).
            raise ValueError(
                "composition: 'parallel' cannot be checked on record_ids given without the release's rows: "
                "the ledger can compare ids only with training records named by the same ids, and training "
                "may have named the same rows by their content or by other ids. Pass the release's data "
                "(x=, y=) with its record_ids, assert the split by name with asserted_disjoint='why', or use "
                "composition='sequential'")
        import numpy as np

        from tfdpbnn.record.record_ledger import default_ledger

        ledger = default_ledger()
        phase_ids = [p.phase_id for p in self.ledger.phases if p.released]
        if ledger is None:
            raise ValueError("composition: 'parallel' cannot be checked with the privacy record store off "
                             "(no per-record ledger); assert it by name with asserted_disjoint='why', or use "
                             "composition='sequential'")
        touched, known = ledger.overlap(keys, phase_ids)
        if not known:
            raise ValueError("composition: 'parallel' cannot be checked: the per-record ledger holds no "
                             "record of this model's training (no DP step yet, or its records were unknown: "
                             f"a tf.data pipeline without record keys); {how}")
        if touched:
            raise ValueError(
                f"composition: 'parallel' refused: {touched} of the release's {len(np.unique(keys))} records "
                "were used by this model's training (per-record ledger), so the release and the training "
                "are not on disjoint records; record it with composition='sequential'")
        return (f"checked: none of the release's {len(np.unique(keys))} records was touched by this model's "
                "training (per-record ledger)")

    def _dp_count_rewind(self, restore) -> None:
        """Run ``restore`` and count again the steps it takes off the ledger.

        ``restore`` restores this optimizer's variables, the ledger's counters among them; the steps it sets
        back ran, so they are counted again as "rewound" phases (``RunRecord.account_rewind``).
        """
        record = attributes.run_record(self)
        state = attributes.ledger_state(self)
        self._dp_bookkeeping_written("found at a restore of the optimizer's variables")  # set back first
        ran = int(_private_api.read_numpy(self.iterations)) > 0
        before = record.ledger_now() if record is not None and ran else None
        restore()
        if before:
            record.account_rewind(before)
        if state is not None:
            state.guard_sync()  # a restore seen and counted: the guard's copies take its values

    def _dp_bookkeeping_written(self, when: str) -> list:
        """Names of the privacy bookkeeping variables written outside tfdpbnn during a ``fit`` (``when``).

        The privacy ledger's variables and the count of DP writes (``LedgerState.guard_changes``; Keras 3
        lists them in ``optimizer.variables``). Found written, they are set back to what the DP steps and
        tfdpbnn wrote (every step that ran is counted), the statement's ``guarantee`` is false (a count of
        DP writes set back lets a weight written from the data pass for a restore) and the run's records
        get a non-private release in the per-record ledger.
        """
        state = attributes.ledger_state(self)
        if state is None:
            return []
        changed = state.guard_changes()
        if not changed:
            return []
        state.guard_set_back()
        reason = (f"the privacy bookkeeping {changed} (the ledger's counts, the count of DP writes) written "
                  f"outside tfdpbnn during fit, {when}")
        self._dp_write_watch.taint([reason])
        record = attributes.run_record(self)
        if record is not None:
            record.mark_unbounded_batches(reason)
        return changed

    def _dp_bookkeeping_written_between_runs(self, when: str) -> None:
        """Outside a ``fit``: the privacy bookkeeping written by code other than tfdpbnn's since it last ran.

        A restore of the optimizer (its checkpoint: ``tf.train.Checkpoint``) sets the ledger's counts and
        the count of DP writes back together, each DP write having counted a step in both: it is taken for a
        restore, and the steps it took off are counted again as "rewound" phases (``account_rewind``, with
        the ledger as tfdpbnn last left it: the statement right after the restore, and a run with the
        privacy record store off, counted only the restored steps before); weights that a restore does not
        bring back void the guarantee (``_dp_restored_weights_known``). One of them written
        alone is no restore: a count of passes set to 0 through Keras 3's ``optimizer.variables`` (the
        statement said epsilon 0 after 2 passes), or the count of DP writes set back after a weight was
        written from the data (which the write watch then took for a restore). Those are set back to what
        ran (with a warning); the count of DP writes written makes the statement's ``guarantee`` false.
        """
        state = attributes.ledger_state(self)
        if state is None:
            return
        changed = state.guard_changes(always=True)
        if not changed:
            return
        write = variable_name(self._dp_write_count)
        if write in changed and len(changed) > 1:  # the optimizer's state restored: both went back
            # The steps it took off ran: counted again as rewound phases (the store finds the same parts,
            # by the same ids, at the next run's start; with the store off nothing else would).
            record = attributes.run_record(self)
            if record is not None:
                record.account_rewind(state.guarded(record.ledger_now))
            state.guard_sync()
            if not self._dp_restored_weights_known():
                self._dp_write_watch.taint([
                    f"the privacy bookkeeping {changed} set back as a restore does, {when}, with weights "
                    "that are neither the last DP write's, an epoch end's, nor weights the privacy record "
                    "holds"])
            return
        state.guard_set_back()
        if write in changed:  # a weight written with it would have passed for a restore
            self._dp_write_watch.taint([f"the privacy bookkeeping {changed} (the count of DP writes) written "
                                        f"outside tfdpbnn, {when}"])
            return
        warnings.warn(f"optimizer.variables: the privacy ledger's variable(s) {changed} were written "
                      f"outside tfdpbnn ({when}), the count of DP writes unchanged (no restore of the "
                      "optimizer): they are set back to what ran", stacklevel=3)

    def _dp_restored_weights_known(self) -> bool:
        """After a restore of this optimizer's state: whether the weights are ones a restore brings back.

        The last DP write's (the optimizer's state restored alone), an epoch end's of this optimizer, or
        weights the privacy record store holds (a checkpoint of model and optimizer that a recorded run
        wrote). A restore sets the count of DP writes back, so the write watch no longer compares the
        weights with the last DP write's: weights written from the data, with the counts set back as a
        restore sets them (Keras 3's ``optimizer.variables``), would otherwise pass.
        """
        watch = self._dp_write_watch
        if not watch._variables or not watch.last_written_state():
            return True  # no DP write yet: nothing to compare
        now = watch.state()
        if now == watch.last_written_state() or now in watch._released:
            return True
        record = attributes.run_record(self)
        return record is not None and record.recognises_weights()

    def _dp_refuse_bookkeeping_written(self, model, when: str) -> None:
        """Refuse a ``fit`` whose privacy bookkeeping was written outside tfdpbnn (see the method above)."""
        changed = self._dp_bookkeeping_written(when)
        if not changed:
            return
        model.stop_training = True
        raise ValueError(
            f"optimizer.variables: the privacy bookkeeping variable(s) {changed} were written during fit "
            f"({when}) by code other than tfdpbnn's: a callback or a train_step writing the optimizer's "
            "variables, or an optimizer checkpoint restored mid-run (tf.train.Checkpoint). The steps the "
            "ledger counted were not the steps that ran, and a count of DP writes set back would let a "
            "weight written from the data pass for a restore: they are set back to what ran, and the privacy "
            "statement now holds no guarantee. Leave the optimizer's dp_* variables to tfdpbnn; restore an "
            "optimizer only between runs, with BackupAndRestore, or (Keras 3) with model.load_weights.")

    def _dp_statement_extras(self) -> dict:
        return {}

    def assert_post_processing(self, reason: str) -> None:
        """Assert that the trainable weights, as they are now, were written without private data.

        A write to the weights after a DP run returned (``fit``, ``train_on_batch``, a custom loop) that
        leaves them neither the last DP step's, an epoch end's, nor weights the privacy record holds
        (``load_weights`` of a recorded checkpoint) voids the statement (``guarantee: false``) and refuses
        the next ``train_on_batch`` call. Post-processing of DP-released weights with public data only keeps
        the guarantee (Dwork and Roth, 2014, Proposition 2.1); tfdpbnn cannot check the claim, so it covers
        these exact weights only (a later write needs its own) and ``reason`` is listed under
        ``asserted_by_user``.
        """
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError("reason must be a non-empty string saying why the weights written after DP "
                             f"training used no private data; got {reason!r}")
        self._dp_write_watch.assert_post_processing(reason)

    # ------------------------------------------------------------------------------- fit integration
    def begin_training(self, model, x, y=None, batch_size=None, validation_split=0.0, shuffle=True, *,
                       assert_per_example_loss: str | None = None, record_ids=None, _fit=False):
        """Check ``x`` and ``model``, draw the run's noise key and open the ledger phase for the steps ahead.

        ``model.fit`` calls it; call it yourself before a custom training loop that uses
        ``optimizer.minimize``. Raises ``ValueError`` for input whose sampling or size does not match the
        optimizer's declarations, and for a model or loss that couples examples of a batch. In a custom loop
        the loop picks the batches (it may feed one batch again and again), so every step is counted as one
        participation of every example, without amplification.

        ``assert_per_example_loss``: in a custom loop, the loss your code hands to ``minimize``,
        ``mechanism.clip_losses``/``privatize_losses`` or ``clip_model(loss_fn=...)`` cannot be checked
        (it is computed from the loop's batch inside your closure); those calls are refused unless you assert,
        with this reason, that each example's loss depends on that example alone. The statement lists the
        assertion under ``asserted_by_user``. ``dp_train_step`` (the compiled loss, checked here) needs none.

        For a custom loop, the per-record ledger (``tfdpbnn.record.record_ledger``) gets a release against the
        records of ``x`` (their content keys as ``fit`` computes them, a pipeline's tagged keys, or
        ``record_ids``, with ``fit``'s meaning and checks), reserved here with an unknown number of steps
        (infinite epsilon until settled; refused under a per-record budget) and settled with what the loop
        spent when a statement reads the ledger, when another run starts in the process, when this
        optimizer's next run ends the loop's phase, and at interpreter exit (``RunRecord.settle_loop``).
        Nothing checks that the loop's batches hold these records: the statement lists it under
        ``asserted_by_user``.
        """
        if assert_per_example_loss is not None and (not isinstance(assert_per_example_loss, str)
                                                    or not assert_per_example_loss.strip()):
            raise ValueError("assert_per_example_loss must be None or a non-empty string saying why each "
                             "example's loss in your custom loop depends on that example alone; got "
                             f"{assert_per_example_loss!r}")
        if _fit and assert_per_example_loss is not None:
            raise ValueError("assert_per_example_loss: only for a custom loop (model.fit checks its loss)")
        if _fit and record_ids is not None:
            raise ValueError("record_ids: only for a custom loop (pass fit(..., record_ids=...))")
        self._begin_training(model, x, y, batch_size, validation_split, shuffle, assert_per_example_loss,
                             _fit)
        if not _fit:
            self._begin_loop_record(model, x, y, record_ids)

    def _begin_loop_record(self, model, x, y, record_ids) -> None:
        """Reserve a custom loop's release for the records of ``x`` in the per-record ledger (begin_training).

        The keys are ``fit``'s (``tfdpbnn.record.records.input_keys``), ``record_ids`` checked as ``fit``
        checks them; the release is reserved with its steps unknown (``RunRecord.begin(loop=True)``).
        """
        from tfdpbnn.record.records import input_keys
        from tfdpbnn.record.store import default_path, input_fingerprint

        if default_path() is None:
            attributes.run_record(self).begin(model, None, None, loop=True)  # ends an earlier loop's release
            return
        fingerprint = input_fingerprint(x, y)
        keys = input_keys(x, y, record_ids, fingerprint)
        description = attributes.ledger_state(self).open_description()
        if isinstance(x, tf.data.Dataset | tf.distribute.DistributedDataset):
            if record_ids is not None:
                keras_integration._refuse_ids_not_naming_every_record(x, keys, description)
                keras_integration._note_ids_without_rows(self)
            elif keys is not None:
                keras_integration._refuse_tagged_keys_not_naming_every_record(keys, description)
        if CUSTOM_LOOP_RECORDS not in attributes.loss_assertions(self):
            attributes.loss_assertions(self).append(CUSTOM_LOOP_RECORDS)
        attributes.run_record(self).begin(model, fingerprint, None, record_keys=keys, loop=True)

    def _begin_training(self, model, x, y, batch_size, validation_split, shuffle, assert_per_example_loss,
                        _fit, sample_weight=False) -> tuple | None:
        """``begin_training``; returns the weights' identity for the record's run start, or None.

        ``sample_weight``: the batches carry per-example weights (``_check_model``).

        For a ``fit`` with the record on: ``(model.weights, identity, keys)`` as ``weights_identity`` gave
        them after the checks (``RunRecord.begin``: nothing between them writes the model's variables).
        """
        # One walk over the model's modules for the dtype and preprocessing checks: nothing between them
        # builds the model or changes its layers.
        self._dp_bookkeeping_written_between_runs("found at the start of a run")
        submodules = _private_api.submodules(model)
        self._adopt_model_ledger(model, submodules)
        self.mechanism.new_run()  # this run's noise key: fresh from os.urandom (tfdpbnn.privacy.noise)
        self._dp_loss_assertion = assert_per_example_loss
        if assert_per_example_loss is not None:
            note = ("custom training loop: the per-example loss handed to the DP mechanism "
                    "(optimizer.minimize, mechanism.clip_losses/privatize_losses, clip_model(loss_fn=...)) "
                    "keeps examples separate: "
                    f"{assert_per_example_loss}")
            if note not in attributes.loss_assertions(self):
                attributes.loss_assertions(self).append(note)
        if not _fit and CUSTOM_LOOP_ROWS not in attributes.loss_assertions(self):
            attributes.loss_assertions(self).append(CUSTOM_LOOP_ROWS)
        if sample_weight and WEIGHTS_FIXED not in attributes.loss_assertions(self):
            attributes.loss_assertions(self).append(WEIGHTS_FIXED)
        check_distributed_input(model.distribute_strategy, x, shuffle=shuffle)
        sampling = fit_checks.input_sampling(self, x, batch_size=batch_size,
                                             validation_split=validation_split)
        self._check_model(model, x, y, submodules, sample_weight=sample_weight, probe_at_traces=_fit)
        if not _fit:  # a custom loop: its own code runs before every trace
            self._user_code_before_first_trace(every_trace=True)
        # Inside fit's block (keras_integration): what was read before the checks, which ran the model's own
        # code (a forward pass, its train_step), is read anew.
        attributes.ledger_state(self).read_anew()
        self._import_shared_training(model)  # built by the checks
        identity = self._refuse_written_between_runs(model, with_identity=_fit)
        # After the checks have built the model. A custom loop's steps also compare the state no DP step may
        # change (model.fit's StateWatch does it at every epoch end, and sets it back).
        self._dp_write_watch.new_run(model.trainable_variables, self._run_constants(model),
                                     kind="fit" if _fit else "custom_loop", state=self._dp_state(model),
                                     writes=self._dp_write_count)
        source = sampling["source"] if _fit else "custom_loop"
        state = attributes.ledger_state(self)
        with state.reading_once():  # opening the phase and finishing a partial pass: no step between
            state.open_phase(
                kind=sampling["kind"], noise_multiplier=self.noise_multiplier, neighboring=self.neighboring,
                sample_rate=sampling["sample_rate"], num_examples=sampling["num_examples"],
                source=source, batch_size=self.batch_size)
            # A call draws its own passes: a pass an earlier call left partial is never completed by this one.
            state.finish_partial_pass()
        return identity

    def assert_public_variable(self, variable, reason: str) -> None:
        """Assert that every value ``variable`` takes during DP training is set without private data.

        A variable the model reads but does not own (``tfdpbnn.optimizers.outside_reads``: a KL weight a
        callback anneals, a schedule set from the epoch number), or a non-trainable weight of the model's
        own, is a constant of the model during a run: a change is refused, since no epsilon covers what a
        value set from the data carries, and a new value can make the model mix examples (``x - alpha *
        mean(x)``). After this assertion a ``fit`` accepts a change of ``variable``: before the next step
        uses a new value (before every batch, after every callback), the model is checked again with it (the
        per-example check) and refused if it no longer keeps examples apart; a layer's weight is no longer
        compared with its initial value at a run's start. ``train_on_batch`` calls and runs check it with
        the value at their start; a custom loop's steps still refuse a change between them (change it
        between runs). ``reason`` (why the values use no private data) is listed under ``asserted_by_user``.
        """
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError("reason must be a non-empty string saying why every value of the variable "
                             f"during DP training is set without private data; got {reason!r}")
        inner = variable if isinstance(variable, tf.Variable) else _private_api.tf_variables([variable])[0]
        if not isinstance(inner, tf.Variable):
            raise ValueError(f"variable must be a tf.Variable (or a Keras 3 variable), got "
                             f"{type(variable).__name__}")
        self._dp_public_variables[id(inner)] = reason
        self._dp_checked_models.clear()  # the next run checks its model again, keeping this variable's value
        note = (f"variable {inner.name!r}, read by the model: every value it takes during DP training is set "
                f"without private data: {reason}")
        if note not in attributes.loss_assertions(self):
            attributes.loss_assertions(self).append(note)

    def _dp_outside_reads_before_step(self, model, when: str) -> None:
        """During a ``fit``: what ``model`` reads outside itself must be as its last check saw it.

        A changed variable asserted public (``assert_public_variable``) is checked with its new value, before
        a step uses it; any other is set back and named in a ``ValueError`` (the statement then says
        ``guarantee: false``). ``when``: where it was found, for the message.
        """
        changed = self._dp_outside_reads_changed(model)
        if not changed:
            return
        refused = [(v, before) for v, before in changed if id(v) not in self._dp_public_variables]
        if refused:
            names = self._dp_set_back_and_taint(model, refused)
            raise ValueError(
                f"model: the variable(s) {names}, read by the model's forward pass or loss but not the "
                f"model's own (a global tf.Variable in a Lambda), changed during DP fit ({when}); what set "
                "them is outside every epsilon, and a new value may make the model mix examples: set back, "
                "and the privacy statement now holds no guarantee. Keep it constant during a run (set it "
                "between runs: the next run checks the model with it), or, if its values are set without "
                "private data (a schedule of the epoch), say so with "
                "optimizer.assert_public_variable(variable, reason=...).")
        self._dp_check_again(model)

    def _dp_set_back_and_taint(self, model, changed) -> list:
        """Set ``(variable, value)`` pairs back, name them written (no guarantee), stop ``model``'s fit."""
        names = [v.name for v, _ in changed]
        for v, before in changed:
            v.assign(before)
        self._dp_write_watch.taint(names)
        model.stop_training = True
        return names

    def _dp_check_again(self, model) -> None:
        """Check ``model`` as it is now on the run's input specs, keeping the new values of what it reads.

        A variable asserted public changed (``assert_public_variable``), before every batch, after every
        callback: nothing runs between this check and the step, so a trace there needs no other.
        """
        with _metrics_set_back(model):
            self._check_examples_kept_apart(model, *self._dp_run_specs)
        self._note_fresh_check((id(model), id(getattr(model, "loss", None))))

    def _dp_outside_reads_after_execution(self, model, steps: int) -> None:
        """After an execution of ``steps`` > 1 steps (``steps_per_execution``): no asserted read changed.

        A variable asserted public (``assert_public_variable``) is checked at each new value before every
        execution; one that the steps themselves change (``optimizer.iterations``) took values inside the
        execution that no check saw. Found at the execution's end (the first callback after the steps): set
        back, named in a ``ValueError``, ``guarantee`` false.
        """
        changed = [(v, before) for v, before in self._dp_outside_reads_changed(model)
                   if id(v) in self._dp_public_variables]
        if not changed:
            return
        names = self._dp_set_back_and_taint(model, changed)
        raise ValueError(
            f"model: the variable(s) {names}, read by the model and asserted public, changed inside an "
            f"execution of {steps} steps (steps_per_execution): the steps themselves change them, so the "
            "steps after the first read values that were never checked to keep examples apart; the privacy "
            "statement now holds no guarantee. Compile with steps_per_execution=1 (each new value is then "
            "checked before the step that reads it).")

    def _dp_outside_reads_changed(self, model) -> list:
        """``(variable, value at its check)`` for what ``model`` reads outside itself, changed since."""
        pairs = self._dp_foreign_variables.get(id(model), ())
        moved = {id(v) for v in outside_reads.changed(pairs)}
        return [(v, before) for v, before in pairs if id(v) in moved]

    def _run_constants(self, model, kind: str = "custom_loop") -> list:
        """What no DP step of a run may change: the model's state outside the DP update and what it reads.

        ``state_checks.variables_outside_dp_update`` and the variables its forward pass, losses and loss
        read that are not its own (``outside_reads``, as its last check listed them); for ``kind``
        "train_on_batch", not those asserted public (each call checks the model with their values then).
        """
        public = self._dp_public_variables if kind == "train_on_batch" else ()
        constants = state_checks.variables_outside_dp_update(model, public, self)
        held = {id(v) for v in constants} | set(public)
        return constants + [v for v, _ in self._dp_foreign_variables.get(id(model), ()) if id(v) not in held]

    def _dp_state(self, model) -> list:
        """This optimizer's state per variable of ``model`` (slots, averages), for the write watch.

        Keras 3 builds it now where ``fit`` would build it before the first step (under the model's
        ``tf.distribute`` strategy), so that the watch compares it from the run's start
        (``WriteWatch.watch_state``); Keras 2 creates it in its first update, where it is watched from.
        """
        adapter = _adapters.current()
        with model.distribute_strategy.scope():
            adapter.build_optimizer_state(self, model.trainable_variables, at_run_start=True)
        return adapter.optimizer_state_variables(self)

    def _dp_swap_in_average(self, swap):
        """Run ``swap``, which sets an average of the DP iterates the optimizer keeps into the weights.

        Keras 3's ``use_ema`` at the end of ``fit``: post-processing of the DP writes (Polyak and Juditsky
        1992), accepted by the write watch as an epoch end's weights are, once the averages are found as the
        last DP write left them (``WriteWatch.state_changed_since_write``); averages written since then
        raise ``ValueError`` naming them, and the statement gives no guarantee.
        """
        watch = self._dp_write_watch
        changed = watch.state_changed_since_write(self._dp_write_count)
        if changed:
            watch.taint(changed)
            raise ValueError(
                f"optimizer: its variable(s) {changed[:3]} changed after its last DP write, outside the DP "
                "step, before use_ema set the averages into the weights. No epsilon covers what they carry; "
                "the optimizer's privacy statement now says guarantee: false.")
        result = swap()
        watch.note_post_processing()
        return result

    def _refuse_written_between_runs(self, model, with_identity: bool) -> tuple | None:
        """Refuse trainable weights written since this optimizer's last DP write (``WriteWatch``).

        A fit, then a write, then this run: refused as between two ``train_on_batch`` calls (``ValueError``
        naming them). Before the write watch's new run (which disarms it), after the checks (which may build
        the model). ``with_identity`` (and the record on): the weights' identity and keys
        (``weights_identity``) are computed first and returned; weights that are an epoch end's are then
        accepted by their identity, without comparing them with the last write's copies as well.
        """
        from tfdpbnn.record import store as record_store

        identity = None
        now = None
        if with_identity and record_store.default_path() is not None:
            identity = (list(model.weights), *record_store.weights_identity(model))
            now = (identity[0], identity[1][len("weights:"):])
        self._dp_write_watch.refuse_written_between_runs(self._dp_write_count,
                                                         attributes.run_record(self).recognises_weights, now)
        return identity

    def begin_batch_call(self, model, x, y=None, record_ids=None, sample_weight=False):
        """Check ``model`` and open the ledger phase for one ``model.train_on_batch(x, y)`` call.

        The batch is given by the caller, so nothing says that its examples differ from the last call's:
        every such step counts as one participation of every example (no amplification, no pooling of
        examples into passes across calls). ``record_ids``: the batch's record ids for the per-record ledger
        (else its records' content hashes); ``sample_weight``: the call carries per-example weights (its
        ``sample_weight`` or ``class_weight``). Raises ``ValueError`` when the optimizer's budget leaves no
        step.
        """
        self._dp_bookkeeping_written_between_runs("found at the start of a train_on_batch call")
        # Trainable weights written since the last DP call's write (ValueError naming them; see WriteWatch)
        self._dp_write_watch.refuse_written_between_runs(self._dp_write_count,
                                                         attributes.run_record(self).recognises_weights)
        constants = self._run_constants(model, "train_on_batch") if model.built else []
        # The state no DP step may change, as the last call left it (ValueError naming what changed since)
        self._dp_write_watch.refuse_changed_constants(constants)
        submodules = _private_api.submodules(model)  # one walk for both checks (begin_training)
        self._adopt_model_ledger(model, submodules)
        self.mechanism.new_run()
        self._check_model(model, x, y, submodules, sample_weight=sample_weight, probe_at_traces=True)
        if sample_weight and WEIGHTS_FIXED not in attributes.loss_assertions(self):
            attributes.loss_assertions(self).append(WEIGHTS_FIXED)
        self._import_shared_training(model)  # built by the checks
        if not constants or self._dp_foreign_variables.get(id(model)):  # after the checks (built, listed)
            constants = self._run_constants(model, "train_on_batch")
        self._dp_write_watch.new_run(model.trainable_variables, constants, kind="train_on_batch",
                                     state=self._dp_state(model), writes=self._dp_write_count)
        attributes.ledger_state(self).open_phase(
            kind="participations", noise_multiplier=self.noise_multiplier, neighboring=self.neighboring,
            sample_rate=None, num_examples=self.num_examples, source="train_on_batch",
            batch_size=self.batch_size)
        phase_id = attributes.ledger_state(self).open_phase_id()
        if self._dp_batch_call_limit is None or self._dp_batch_call_limit[0] != phase_id:
            left = self.budget_steps_left()  # searched once per phase, not at every call
            self._dp_batch_call_limit = (phase_id, None if left is None else self.steps + left)
        limit = self._dp_batch_call_limit[1]
        if limit is not None and self.steps >= limit:
            raise ValueError(
                f"epsilon: the budget target_epsilon={self.target_epsilon:g} (delta={self.delta:g}) is "
                f"spent: epsilon is {self.epsilon():.4g} after {self.ledger.steps} steps and one more "
                "train_on_batch step would exceed it. Build the optimizer with allow_exceeding_budget=True "
                "to go on (the privacy statement then reports the larger epsilon).")
        from tfdpbnn.record.records import input_keys
        from tfdpbnn.record.store import input_fingerprint

        fingerprint = input_fingerprint(x, y)
        attributes.run_record(self).begin(model, fingerprint, planned_steps=1,
                                              record_keys=input_keys(x, y, record_ids, fingerprint))
        self.note_released_training_metrics()

    def _adopt_model_ledger(self, model, submodules=None):
        """Make this optimizer the holder of ``model``'s ledger, importing the previous holder's phases."""
        fit_checks.check_compute_dtype(model, submodules)
        link = attributes.ledger_link(model)
        previous = None if link is None else link.optimizer
        if previous is not None and previous is not self:
            attributes.ledger_state(previous).close_open_phase(
                closed_by=f"another DP optimizer ({self._dp_named()}) began training the same model")
            for phase, source in zip(attributes.ledger_state(previous).closed_phases(),
                                     attributes.ledger_state(previous).closed_sources(), strict=True):
                attributes.ledger_state(self).append(phase, source)
            attributes.inherit_releases(self, previous)  # its private calibrations and the like
            self._inherit_unguaranteed(previous)
            held = attributes.loss_assertions(self)  # and the assertions its custom-loop phases rest on
            held.extend(a for a in attributes.loss_assertions(previous) if a not in held)
            self._dp_batch_call_limit = None
        if previous is not self:  # a link to this optimizer already (never changed in place) is kept
            self._hold_ledger_of(model)

    def _hold_ledger_of(self, model) -> None:
        """Link ``model`` to this optimizer as the holder of its ledger (its next DP run imports from it)."""
        attributes.set_ledger_link(model, _LedgerLink(self))

    def _import_shared_training(self, model) -> None:
        """Import the phases of every other DP optimizer that trained one of ``model``'s trainable variables.

        A layer shared by two models, or a trained model's layers under a new head, carry the training of
        every optimizer that updated them; this optimizer's ledger then holds those phases (and their
        releases) too, and its statement and ledger bound compose them. The other optimizer's open phase is
        closed (its next steps open a new one). Then this optimizer is noted as a trainer of the variables.
        """
        variables = model.trainable_variables
        state = attributes.ledger_state(self)
        for other in attributes.variable_trainers(variables):
            if other is self:
                continue
            attributes.ledger_state(other).close_open_phase(
                closed_by=f"another DP optimizer ({self._dp_named()}) began training a model that shares "
                          "trainable variables with this optimizer's")
            for phase, source in zip(attributes.ledger_state(other).closed_phases(),
                                     attributes.ledger_state(other).closed_sources(), strict=True):
                state.append(phase, source)
            attributes.inherit_releases(self, other)
            self._inherit_unguaranteed(other)
        attributes.add_variable_trainer(variables, self)

    def _import_model_training(self, model) -> None:
        """Import what ``model``'s weights carry: other optimizers' training, DP preprocessing releases."""
        self._import_shared_training(model)
        self._note_model_preprocessing(model)

    def _note_compiled_model(self, model) -> None:
        """``model.compile`` took this optimizer: its statement before any run is of that model's weights."""
        self._dp_compiled_model = weakref.ref(model)

    def _compiled_model(self):
        """The model compiled with this optimizer, for a statement before any run, or None.

        None once the optimizer holds a released phase of its own (restored from a checkpoint or a saved
        config: its ledger is the record), when the model is gone, or compiled with another optimizer since.
        """
        if any(p.released for p in self.ledger.phases):
            return None
        model = None if self._dp_compiled_model is None else self._dp_compiled_model()
        return model if model is not None and getattr(model, "optimizer", None) is self else None

    def _dp_note_unguaranteed(self) -> tuple[list, list]:
        """``(written, after)``: names of variables written outside this optimizer's DP steps, no guarantee.

        ``written``: found during its runs (``WriteWatch.written``), inherited from optimizers whose training
        this one imported (``_inherit_unguaranteed``), and ``after``; ``after``: trainable weights written
        since its last run ended (after ``fit`` or ``train_on_batch`` returned) to values that are neither
        that run's last DP write, an epoch end's, nor weights the record holds, and not asserted by the user
        (``assert_post_processing``). Weights written after the run are recorded so in the store, with a
        release without noise (``RunRecord.record_written``): found by their values in another process,
        they give no guarantee there either.
        """
        watch = self._dp_write_watch
        after, asserted = watch.written_after_run(self._dp_write_count,
                                                  attributes.run_record(self).recognises_weights)
        after = after if asserted is None else []
        written = watch.written()
        written = written + [n for n in after if n not in written]
        if after:
            attributes.run_record(self).record_written(written)
        return written, after

    def _inherit_unguaranteed(self, other) -> None:
        """Carry ``other``'s writes outside its DP steps into this optimizer's: its training is imported.

        Its training is in the weights this optimizer trains on, and so is what was written outside its
        steps (a weight set from the data, a plain optimizer's steps after its run): no epsilon covers them,
        here either. Taken once per optimizer, at the first import (before this one's steps change the
        weights ``other`` compares with its last write).
        """
        if other in self._dp_inherited_from:
            return
        self._dp_inherited_from.add(other)
        suffix = " (in an earlier optimizer's training, imported)"
        self._dp_write_watch.taint([name if name.endswith(suffix) else name + suffix
                                    for name in other._dp_note_unguaranteed()[0]])

    def _note_model_preprocessing(self, model) -> None:
        """Add the DP preprocessing releases ``model``'s layers hold (or the record store knows by value).

        A new optimizer of a loaded or cloned model composes them before its first step; nothing is refused
        here (the next DP step's checks do that).
        """
        from tfdpbnn.preprocessing.checks import preprocessing_releases

        held = (attributes.preprocessing_found(self) or {"dp": []})["dp"]
        found = preprocessing_releases(model, held)
        if found["dp"] or found["asserted_public"]:
            attributes.add_preprocessing_found(self, found)

    def _dp_unvouched_preprocessing(self, model) -> list[str]:
        """Names of ``model``'s preprocessing layers whose state no DP release or public assertion covers.

        For the statement (``tfdpbnn.preprocessing.checks.unvouched_preprocessing``): a layer adapted,
        assigned or set after ``fit`` makes its ``guarantee`` false.
        """
        from tfdpbnn.preprocessing.checks import unvouched_preprocessing

        return unvouched_preprocessing(model, attributes.preprocessing_found(self))

    def _check_fit_arguments(self, arguments: dict) -> None:
        """Refuse ``fit`` arguments this optimizer's accounting cannot cover (none here) before anything runs.

        ``arguments``: ``fit``'s arguments by name (``validation_data``, ``validation_split``, ...).
        """

    def _check_model(self, model, x, y, submodules=None, sample_weight=False, probe_at_traces=False):
        """The per-example checks of ``model`` on a synthetic batch shaped like ``x`` (once per model).

        Not run again for a model of a structure whose check passed in this process (``known_structure``).

        ``submodules``: ``_private_api.submodules(model)`` when the caller has just walked the model.
        ``sample_weight``: the batches carry per-example weights: a ``train_step`` override is probed with
        them too (once per model and loss). ``probe_at_traces``: the run calls the model's ``train_step``
        (``fit``, ``train_on_batch``): an override is probed again at each trace of a DP step inside it
        with a DP write since its last probe (``_probe_traced_override``).
        """
        from tfdpbnn.preprocessing import check_preprocessing
        from tfdpbnn.record.other_releases import adopt_search_record

        held = (attributes.preprocessing_found(self) or {"dp": []})["dp"]  # e.g. from a saved config
        _build_sequential_holding_dp_preprocessing(model, x, y)
        found = check_preprocessing(model, self.neighboring, submodules=submodules, held=held)  # every call
        asserted_state = state_checks.check_declared_state(model, self._dp_public_variables)  # own state only
        # Added to the releases found before (a layer adapted again: the earlier weights depend on both).
        attributes.add_preprocessing_found(
            self, {**found, "asserted_public": found["asserted_public"] + asserted_state})
        adopt_search_record(self, model)
        # Checked once per model and compiled loss: a model compiled again with another loss is checked again;
        # a model that runs its steps eagerly (run_eagerly), whose step runs the model's Python code as it is
        # at each step, is checked at every run's start. A retraced step is checked as it is traced
        # (_check_traced_step, _probe_traced_override).
        checked = (id(model), id(getattr(model, "loss", None)))
        # The inputs' specs, not their values: nothing of the data stays with the optimizer.
        self._dp_run_specs = fit_checks.element_specs(x, y)
        self._dp_fresh_checks.clear()  # a check of an earlier run says nothing of the model as it is now
        self._dp_check_every_trace = False
        eager = _runs_eagerly(model)
        overrides = fit_checks.overrides_train_step(model)
        if probe_at_traces and not overrides:  # fit, train_on_batch: the step is dp_train_step
            fit_checks.refuse_ignored_compute_loss(model, "the DP step of fit and train_on_batch")
        probed = False
        # A variable the model reads but does not own, changed since its check (between runs), changes what
        # the step computes: the model is checked again with its value now.
        if checked not in self._dp_checked_models or eager or id(model) in self._dp_unkept_reads or \
                self._dp_outside_reads_changed(model):
            self._check_examples_kept_apart(model, x, y, submodules)
            self._note_fresh_check(checked)  # the model as this run's first trace will find it
            if overrides:
                self._probe_train_step(model, x, y)
                probed = True
            self._dp_checked_models.add(checked)
        weighted = (*checked, "sample_weight")
        if sample_weight and (weighted not in self._dp_checked_models or eager):
            if overrides:
                self._probe_train_step(model, x, y, sample_weight=True)
                probed = True
            self._dp_checked_models.add(weighted)
        self._dp_override_run = None
        if overrides and probe_at_traces:
            self._dp_override_run = {"model": model,
                                     "sample_weight": sample_weight,
                                     "writes": self._dp_writes() if probed else None}

    def _check_examples_kept_apart(self, model, x, y, submodules=None, list_reads=True):
        """The per-example checks of ``model``'s forward pass and compiled loss, on a synthetic batch.

        ``x``, ``y``: ``fit``'s data or their element specs. Not run for a model of a structure whose check
        passed in this process (``known_structure``); a check that passes with no foreign variable read is
        kept for its structure. ``list_reads=False`` (an eager step, checked with the values as they are at
        every step): the variables read outside the model are not listed again (``outside_reads``).
        """
        check_per_example_independence(model)
        if submodules is None:
            submodules = _private_api.submodules(model)
        _check_data_independent_losses(model, submodules)
        loss_fn = compiled_per_example_loss_fn(model) if getattr(model, "loss", None) else None
        # A model of a structure whose check is known (known_structure) and passed: not run again.
        structure = known_structure.structure_key(model, *fit_checks.element_parts(x, y), submodules)
        known = known_structure.passed(structure)
        if known:
            self._dp_foreign_variables[id(model)] = []
        # A model built by its first call: build it, then watch a forward pass for variable updates.
        runs = 0 if known else 1 if model.built and model.variables else 2
        for run in range(runs):
            snapshot = state_checks.VariableSnapshot(model)
            try:  # the reads listed once, by the last run (the first of two builds the model)
                reads = fit_checks.check_per_example(model, loss_fn, x, y,
                                                     list_reads=list_reads and run == runs - 1)
            except BaseException:
                snapshot.restore()
                raise
            snapshot.refuse_changes("a forward pass in training mode (on a synthetic batch)")
            if reads is None:
                continue
            # The check's outcome holds for these variables' values now (checked again when they change), and
            # for the model's own variables asserted public (kept as they are: StateWatch leaves them out).
            own_public = [w for w in _private_api.tf_variables(model.weights)
                          if id(w) in self._dp_public_variables]
            self._dp_foreign_variables[id(model)] = outside_reads.values([*reads.variables, *own_public])
            if reads.complete:
                self._dp_unkept_reads.discard(id(model))
                if not reads.variables:
                    known_structure.note_passed(structure)
            else:  # what it reads cannot all be kept: checked again at every run's start
                self._dp_unkept_reads.add(id(model))

    def _user_code_before_first_trace(self, every_trace: bool = False) -> None:
        """Forget this run's checks as its first trace's: code of the user's may run before that trace.

        A ``fit`` callback other than tfdpbnn's (its ``on_train_begin``) may change the model before the
        step is traced: the first trace then checks the model, and probes a ``train_step`` override, as it
        finds them (``_check_traced_step``). ``every_trace``: a custom loop, whose own code runs after
        ``begin_training`` and between any two traces (a concrete function traced ahead, two steps in one
        ``tf.function``), with or without a DP write: every trace of the run checks the model.
        """
        self._dp_fresh_checks.clear()
        self._dp_check_every_trace = every_trace
        if self._dp_override_run is not None:
            self._dp_override_run["writes"] = None

    def _dp_writes(self) -> float:
        """The DP writes this optimizer has applied (``_dp_write_count``), read eagerly."""
        with tf.init_scope():  # a read needs no tape
            return float(_private_api.read_numpy(self._dp_write_count))

    def _note_fresh_check(self, checked) -> None:
        """Note that ``checked`` (model, loss) passed the checks as it is now, before the next DP write."""
        self._dp_fresh_checks[checked] = self._dp_writes()

    @tf.autograph.experimental.do_not_convert
    def _check_traced_step(self, model, x, y):
        """At a trace of ``clip_model``, or at an eager step: the per-example checks of ``model`` as it runs.

        ``dp_train_step`` (what ``fit`` runs) and a custom loop's ``mechanism.clip_model`` or
        ``privatize_model`` in a ``tf.function`` reach it at their traces; a step that runs eagerly
        (``run_eagerly``, a custom loop without ``tf.function``) at every step, where it runs the model's
        Python code as it is then (a callback that changed a layer between two steps): such a step with a
        DP write since the last check is checked, before its update, as a trace is (a model that runs
        eagerly costs one check per step beyond the first: about 1.5 ms for a known structure, whose check
        is its key, and a full check for any other).

        Keras traces the step at a model's first ``fit`` (twice when the first trace creates variables) and
        again for new input shapes or dtypes, a dropped train function or another ``jit_compile``. A trace
        bakes the model's Python code as it is then into the step: a layer changed since the last check (an
        attribute that now subtracts the batch mean, a ``Reshape`` to ``()``) is found here, before any step
        of the new trace runs, and the fit raises ``ValueError``. A trace with no DP write since the check
        at an earlier trace, or since this run's start where no code of the user's runs before the first
        trace (a ``fit`` with no callback but tfdpbnn's, a ``train_on_batch`` call), is not checked again:
        the model is as checked. Every trace of a custom loop is checked (its own code runs between any two:
        ``_user_code_before_first_trace``). Run on a synthetic batch of the traced inputs' specs, eagerly
        (at a trace in a thread of its own); under a ``tf.distribute`` strategy once, in its cross-replica
        context (``merge_call``). The model's metric objects are set back after it (``_metrics_set_back``).
        """
        self._refuse_batch_given_to_every_replica(x)
        checked = (id(model), id(getattr(model, "loss", None)))
        eager = tf.executing_eagerly()  # an eager step: the values read outside the model are as checked

        def check(*_):
            writes = self._dp_writes()
            if self._dp_fresh_checks.get(checked) == writes and not self._dp_check_every_trace:
                return
            with _metrics_set_back(model):
                specs = fit_checks.element_specs(x, y)
                if eager:  # no trace's scopes to leave
                    self._check_examples_kept_apart(model, *specs, list_reads=False)
                else:
                    _in_a_thread_of_its_own(self._check_examples_kept_apart, model, *specs)
            self._dp_fresh_checks[checked] = writes

        context = tf.distribute.get_replica_context()
        if tf.distribute.has_strategy() and context is not None:
            context.merge_call(check)
        else:
            check()

    @tf.autograph.experimental.do_not_convert
    def _probe_traced_override(self):
        """At a trace of a DP step inside a ``train_step`` override, or an eager one: probe the override.

        The override (``_probe_train_step``) is probed at a run's start, once per model and loss; a trace of
        its step bakes its Python code as it is then (an attribute that now makes its loss contrastive), and
        a step that runs eagerly (``run_eagerly``) runs it as it is at that step (a callback may have changed
        it). A trace or an eager step with a DP write since the override's last probe probes it again, in a
        thread of its own (eager, as at a run's start), before the step's update; the run raises
        ``ValueError`` when its loss is no longer per example. Models under a ``tf.distribute`` strategy are
        not probed.
        """
        run = self._dp_override_run
        if tf.distribute.has_strategy():
            return
        writes = self._dp_writes()
        if run["writes"] == writes:
            return
        _in_a_thread_of_its_own(self._probe_train_step, run["model"], *self._dp_run_specs,
                                sample_weight=run["sample_weight"])
        run["writes"] = writes

    def _probe_train_step(self, model, x, y, sample_weight=False):
        """Run ``model``'s own ``train_step`` once on a synthetic batch, up to the mechanism, and undo it.

        The per-example loss it hands to ``minimize``, ``mechanism.clip_losses`` or ``mechanism.clip_model``
        (with a ``loss_fn``) is checked by ``fit_checks.LossProbe`` (examples kept separate), and every model
        variable the step changed before that is refused by name (``state_checks.VariableSnapshot``). The
        compiled loss of ``dp_train_step`` is ``check_per_example``'s. Models without float inputs (nothing
        to differentiate) and models under a ``tf.distribute`` strategy (the step needs a replica context)
        are not probed.
        """
        if tf.distribute.has_strategy() or model.distribute_strategy is not tf.distribute.get_strategy():
            return
        probe = fit_checks.LossProbe(x, y, sample_weight=sample_weight)
        if not [t for t in probe.inputs if t is not probe.sample_weight]:  # no float input to differentiate
            return
        snapshot = state_checks.VariableSnapshot(model)
        self._dp_probe = probe
        try:
            # recording: how the batch handed to dp_train_step derives from the inputs
            with _metrics_set_back(model), probe.recording():
                model.train_step(probe.data)
        except fit_checks.ProbeReached:
            pass
        except ValueError:
            snapshot.restore()
            raise
        except Exception as err:
            snapshot.restore()
            raise ValueError(
                f"model: tfdpbnn runs {type(model).__name__}.train_step once on a synthetic batch (no "
                "private data, no update) to check that the loss it hands to the DP mechanism is per "
                f"example, and it raised {type(err).__name__}: {err}") from err
        finally:
            self._dp_probe = None
        snapshot.refuse_changes(f"{type(model).__name__}.train_step (on a synthetic batch, before its DP "
                                "update)")

    def budget_steps_left(self):
        """Steps the budget still allows (None without a budget or with ``allow_exceeding_budget``)."""
        if self.target_epsilon is None or self._dp_static["allow_exceeding_budget"]:
            return None
        return self.steps_within(self.target_epsilon, self._resolve_delta(None))

    def steps_within(self, budget, delta, accountant=None) -> int:
        """Largest number of further steps whose epsilon stays <= ``budget`` (0 if none).

        Epsilon grows with the steps, so an exponential then a binary search over ``_epsilon_if`` finds it.
        """

        def within(extra):
            return self._epsilon_if(extra, delta, accountant) <= budget

        if not within(0) or not within(1):
            return 0
        lo, hi = 1, 2
        while within(hi):
            lo, hi = hi, hi * 2
            if hi > 10 ** 9:
                return hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if within(mid):
                lo = mid
            else:
                hi = mid
        return lo

    def warn_if_plan_exceeds_budget(self, planned_steps):
        """Warn when ``planned_steps`` more steps would exceed the budget sigma was calibrated for."""
        if self.target_epsilon is None or planned_steps is None or planned_steps <= 0:
            return
        delta = self._resolve_delta(None)
        planned = self._epsilon_if(planned_steps, delta)
        if planned > self.target_epsilon * (1 + 1e-9):
            action = ("training will go on past it (allow_exceeding_budget=True)"
                      if self._dp_static["allow_exceeding_budget"] else
                      f"training stops before the step that would exceed it (after "
                      f"{self.budget_steps_left()} more steps)")
            warnings.warn(
                f"epochs: the planned {planned_steps} steps would spend epsilon {planned:.4g} > the budget "
                f"{self.target_epsilon:.4g} (delta {delta:g}) sigma was calibrated for; {action}",
                UserWarning, stacklevel=3)

    # ------------------------------------------------------------------------------ the DP gradient
    def _dp_sum_scale(self):
        """The constant s the clipped sum and its noise are multiplied by: ``1 / B`` (B the expected size).

        ``self.mechanism`` folds it into the clip factors, so the division costs no pass over the gradients.
        """
        return 1.0 / self._f32(self._dp_batch_size)

    def _dp_count_batch(self, batch_size):
        """``self.mechanism``'s ``on_batch``: count the batch in the ledger; mark the gradient as private.

        At a trace of a step inside a ``train_step`` override of a ``fit`` or ``train_on_batch`` run, and at
        such a step run eagerly, the override is probed as the step finds it (``_probe_traced_override``).
        """
        self._require_open_phase()
        if self._dp_in_fit and self._dp_probe is None:
            self._refuse_second_write_in_step()
        if self._dp_override_run is not None:
            self._probe_traced_override()
        attributes.ledger_state(self).record_batch(batch_size)
        _private_api.mark_dp_gradients_computed(self)

    def _refuse_second_write_in_step(self):
        """Refuse a second DP write in one step of a ``fit``: each step's batch is the one its sampler drew.

        A ``train_step`` override that calls ``dp_train_step`` (or ``minimize``) twice, the second time on a
        batch of its own (records captured from the training set, a replay buffer), puts those records in
        every step while the ledger counts them as drawn like the others (7.08 printed where 17.80 holds).
        Counted at each trace, per replica: the writes in the graph being traced (a ``steps_per_execution``
        loop traces its step once), and the lines of code outside tfdpbnn that write anywhere in the
        outermost function being traced (a second update inside a ``tf.cond`` branch, a ``tf.while_loop``
        body or a nested ``tf.function`` of the step, where a retrace of the same body writes from the same
        line); for a step run eagerly, per batch the monitor starts (``steps_per_execution`` writes at most).
        """
        if tf.executing_eagerly():
            if self._dp_eager_step_limit is None:
                return
            # Counted per replica: under a strategy every replica runs the step's update once, eagerly too.
            replica = _replica_id(tf.distribute.get_replica_context())
            writes = self._dp_eager_step_writes
            writes[replica] = count = writes.get(replica, 0) + 1
            limit = self._dp_eager_step_limit
        else:
            replica = _replica_id(tf.distribute.get_replica_context())
            writes = self._dp_writes_per_trace.setdefault(tf.compat.v1.get_default_graph(), {})
            writes[replica] = count = writes.get(replica, 0) + 1
            # The function being traced, whole: a write from another line of code in a control-flow branch
            # or nested function of it is a second update (a retrace of the same body writes from its line).
            outermost = self._dp_write_sites.setdefault(_outermost_function_graph(), {})
            sites = outermost.setdefault(replica, set())
            sites.add(_caller_outside_tfdpbnn())
            count, limit = max(count, len(sites)), 1
        if count > limit:
            raise ValueError(
                "model: its train_step makes more than one DP update per step of fit (dp_train_step, "
                "minimize or the mechanism called twice). Each step's batch is the one fit's sampler drew, "
                "and the privacy ledger counts every update's examples as drawn so; a second update on "
                "another batch (records kept from the training set, a replay buffer) would put those "
                "records in every step. Make one DP update per step, on the step's batch.")

    def _refuse_batch_given_to_every_replica(self, x):
        """Refuse a step's input that two replicas of a ``tf.distribute`` strategy both clip.

        ``strategy.run(step, args=(x, y))`` with plain tensors hands every replica the same batch: the
        replicas' clipped sums are added and one record moves the update by (replicas) C, while each step
        is accounted at C (68.62 where 25.93 was printed, 2 replicas, 16 steps). A distributed dataset or
        ``experimental_distribute_values_from_function`` gives each replica its own rows. Found at the
        step's trace, where every replica's clip of the same tensor is seen in one graph, and at each step
        of replicas run eagerly, which clip the same tensor object (compared while it is alive).
        """
        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync <= 1:
            return
        replica = _replica_id(context)
        if replica is None:
            return
        others = [r for r in range(context.num_replicas_in_sync) if r != replica]
        for leaf in tf.nest.flatten(x):
            if not isinstance(leaf, tf.Tensor):
                continue
            # The same tensor object (symbolic at a trace, eager when replicas run eagerly), alive.
            shared = any(self._dp_replica_inputs.get((id(leaf), r)) is leaf for r in others)
            self._dp_replica_inputs[(id(leaf), replica)] = leaf
            if shared:
                raise ValueError(
                    "x: every replica of the tf.distribute strategy clips the same batch (a tensor handed to "
                    "strategy.run as it is goes to every replica), so their clipped sums add up and one "
                    "example moves the update by the number of replicas times the clip bound, while each "
                    "step is accounted at one. Give each replica its own rows: "
                    "strategy.experimental_distribute_dataset or "
                    "strategy.experimental_distribute_values_from_function.")

    def _dp_new_eager_steps(self, steps):
        """The monitor starts a batch of ``steps`` steps (``steps_per_execution``); counted if eager."""
        self._dp_eager_step_writes, self._dp_eager_step_limit = {}, int(steps)

    def _dp_gradients(self, clipped, var_list):
        """This optimizer's update direction from one clipped batch (``self.mechanism.clip_*``).

        DP-SGD: the mechanism's release, noised mean plus the regularization gradient. DP-SGLD and SI-DPSGD
        override it with their papers' rules.
        """
        return self.mechanism.release(clipped).gradients

    def _dp_before_step(self, model):
        """Hook run before the forward pass of each step (SI-DPSGD sets the weight noise here)."""

    def _dp_extra_logs(self, model):
        """Extra scalars for the Keras logs (DPVD's zeta and alpha)."""
        return {}

    def dp_train_step(self, model, data):
        """The DP ``Model.train_step``: what ``model.fit`` runs when this optimizer is compiled in.

        Call it from a ``train_step`` override to take this optimizer's DP step on ``data``
        (``(x, y)`` or ``(x, y, sample_weight)``); it returns the Keras logs.
        """
        if self._dp_probe is not None:  # the compiled loss: fit_checks.check_per_example has checked it
            self._dp_probe.check_batch(tf.keras.utils.unpack_x_y_sample_weight(data)[0], "dp_train_step")
            raise fit_checks.ProbeReached("dp_train_step")
        fit_checks.refuse_ignored_compute_loss(model, "dp_train_step")
        x, y, sample_weight = tf.keras.utils.unpack_x_y_sample_weight(data)
        attributes.set_step_optimizer(model, self)  # the traced step calls this optimizer (retrace_for)
        self._require_open_phase()
        self._dp_before_step(model)
        var_list = model.trainable_variables
        clipped = self.mechanism.clip_model(model, x, y, sample_weight, var_list=var_list)
        grads = self._dp_record_release(self._dp_gradients(clipped, var_list))
        self.apply_gradients(zip(grads, var_list, strict=True))
        logs = self._dp_training_metrics(model, x, y, sample_weight, clipped)
        logs.update(self._dp_extra_logs(model))
        if not logs:
            with tf.init_scope():
                needs_output = _private_api.train_step_needs_output(model)
            if needs_output:  # the train function needs some output: a constant, withheld from logs
                logs[NO_RELEASED_METRICS] = tf.zeros([])
        return _private_api.step_logs(model, logs)

    def _dp_training_metrics(self, model, x, y, sample_weight, clipped):
        """The released training-batch metrics of one step (``release_training_metrics``), as logs.

        Metrics not released are not computed: the loss tracker and the compiled metrics are updated only
        when some metric is released, and every metric object of ``model.metrics`` not released
        (``add_metric`` ones too, which the forward pass updates) is reset at the end of the step, inside it,
        so
        ``model.get_metrics_result()`` and the metric objects hold nothing of the private batches.
        """
        released = self.release_training_metrics
        names = None if released is True else set(released or ())
        logs = {}
        realized = tf.cast(tf.shape(clipped.per_example_loss)[0], tf.float32)
        data_loss = tf.math.divide_no_nan(tf.reduce_sum(clipped.per_example_loss), realized)
        total_loss = data_loss + tf.cast(clipped.regularization_loss, tf.float32)
        if names is None or "loss" in names:
            loss_mean = _private_api.total_loss_metric(model)
            if loss_mean is not None:
                loss_mean.update_state(total_loss, sample_weight=realized)
            logs["loss"] = total_loss if loss_mean is None else loss_mean.result()
        # Keras 3 builds compiled metrics at their first update and fails at fit's end without one: there
        # they are computed once and reset below, inside the step, like every metric not released.
        if names is None or names - {"loss"} or _private_api.compiled_metrics_unbuilt(model):
            logs.update(model.compute_metrics(x, y, clipped.y_pred, sample_weight))
        if names is None:
            return logs
        logs = {k: v for k, v in logs.items() if k in names}
        for metric in _private_api.metric_objects(model):
            if metric.name not in names:
                metric.reset_state()
        return logs

    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
        """``optimizer.minimize(loss, vars, tape=tape)`` from a custom train step (tf-privacy's contract).

        ``loss`` must be a per-example loss VECTOR ``[batch]`` (or ``[batch, ...]``, averaged per example);
        every term in it is clipped (``self.mechanism.clip_losses``), including any regularization added to
        it. A scalar raises.
        """
        if not callable(loss) and tape is None:
            raise ValueError("tape: a GradientTape is required when a Tensor loss is passed to minimize")
        if self._dp_probe is None:
            self._require_open_phase()
        tape = tape if tape is not None else tf.GradientTape()
        if callable(loss):
            with tape:
                if not callable(var_list):
                    tape.watch(_private_api.tf_variables(tf.nest.flatten(var_list)))
                loss = loss()
                if callable(var_list):
                    var_list = var_list()
        var_list = tf.nest.flatten(var_list)
        loss = tf.convert_to_tensor(loss)
        if loss.shape.rank == 0:
            raise ValueError(
                f"loss: {type(self).__name__} received an already-reduced scalar loss, which cannot be "
                "clipped per example, so training would not be private. Pass the per-example loss vector of "
                "shape [batch] (e.g. tf.keras.losses.SparseCategoricalCrossentropy(reduction='none')(y, "
                "y_pred)) to optimizer.minimize(loss, var_list, tape=tape), or do not override train_step: "
                "model.fit's train step builds per-example losses from model.compile(loss=...).")
        if self._dp_probe is not None:  # the first call of a train_step override, on a synthetic batch
            self._dp_probe(loss, tape, "optimizer.minimize")
        else:
            self._dp_require_loss_checked("optimizer.minimize")
        clipped = self.mechanism.clip_losses(loss, var_list, tape)
        grads = self._dp_record_release(self._dp_gradients(clipped, var_list))
        return list(zip(grads, var_list, strict=True))

    def _dp_require_loss_checked(self, where: str) -> None:
        """Refuse a user loss reaching the mechanism in a custom loop that did not assert it (begin_training).

        In ``fit`` and ``train_on_batch`` a ``train_step`` override's loss is probed before the first step;
        in a custom loop the loss is the loop's own, on its own batch, so the user asserts it by name.
        """
        with tf.init_scope():
            if not attributes.ledger_state(self).has_open_phase:
                return  # refused by _require_open_phase
            source = attributes.ledger_state(self).open_description()["source"]
        if source == "custom_loop" and self._dp_loss_assertion is None:
            raise ValueError(
                f"assert_per_example_loss: {where} in a custom training loop receives a loss that tfdpbnn "
                "cannot "
                "check for per-example independence (your code computes it from the loop's batch; a "
                "contrastive loss or a batch mean inside it would make one example move every loss, beyond "
                "the clip bound). Either call optimizer.begin_training(model, x, y, ..., "
                "assert_per_example_loss='<why each example's loss depends on that example alone>') (listed "
                "under asserted_by_user in the privacy statement), or step with "
                "optimizer.dp_train_step(model, (x, y)), whose compiled loss is checked before the first "
                "step.")

    def _dp_record_release(self, grads):
        """Remember ``grads`` as released by this optimizer's mechanism in the current step."""
        self._dp_released.extend(g for g in grads if g is not None)
        return grads

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        """Apply gradients released by this optimizer's mechanism in this step; refuse any others.

        The gradients must be the very tensors that ``minimize``/``_compute_gradients``, ``dp_train_step`` or
        ``optimizer.mechanism``'s ``release`` returned since the last ``apply_gradients`` (under
        ``tf.function`` the check runs when the step is traced). Ordinary gradients (a custom loop, a
        ``train_step`` override computing ``tape.gradient``) would be applied unclipped and un-noised.
        """
        grads_and_vars = list(grads_and_vars)
        released = self._dp_released
        foreign = [v.name for g, v in grads_and_vars
                   if g is not None and not any(g is r for r in released)]
        if foreign:
            raise ValueError(
                f"grads_and_vars: the gradients for {foreign[:3]} did not come from this optimizer's DP "
                "mechanism in this step, so applying them would not be private (no per-example clipping, "
                f"no noise) and no epsilon would cover them. {type(self).__name__} applies only gradients "
                "from optimizer.minimize(per_example_loss, var_list, tape=tape), "
                "optimizer.dp_train_step(model, data) or optimizer.mechanism.privatize_model/"
                "privatize_losses (read .gradients).")
        # Forget what is applied now (only that: under tf.distribute, replicas trace their steps in turns).
        applied = [g for g, _ in grads_and_vars if g is not None]
        self._dp_released = [r for r in released if not any(r is g for g in applied)]
        written = [v for g, v in grads_and_vars if g is not None]
        # The state this update writes besides the weights (slots, averages), made now if the base would make
        # it in its update, and watched from this step on.
        adapter = _adapters.current()
        adapter.build_optimizer_state(self, written)
        self._dp_write_watch.watch_state(adapter.optimizer_state_variables(self), self._dp_write_count)
        # Refused inside the step when a weight changed since the last DP update (state_checks.WriteWatch).
        with tf.control_dependencies(self._dp_write_watch.before_write(written, self._dp_write_count)):
            result = super().apply_gradients(grads_and_vars, *args, **kwargs)
            # Counted only when the update ran (a refused step fails before it, as Keras's iterations do).
            self._dp_write_count.assign_add(tf.constant(1.0, tf.float64))
            attributes.ledger_state(self).shadow_add(self._dp_write_count, tf.constant(1.0, tf.float64))
        self._dp_write_watch.after_write(written, self._dp_write_count)
        return result

    #: Open-phase sources whose steps may run outside model.fit (the caller picks the batches).
    _OUTSIDE_FIT_SOURCES = ("custom_loop", "train_on_batch")

    def _dp_named(self) -> str:
        """This optimizer as a message names it: its class, and its Keras name where that says more."""
        name = getattr(self, "name", None) or getattr(self, "_name", None)
        return type(self).__name__ if not name or name == type(self).__name__ else \
            f"{type(self).__name__} {name!r}"

    def _require_open_phase(self):
        with tf.init_scope():
            state = attributes.ledger_state(self)
            if not state.has_open_phase and state.closed_by is not None:
                raise ValueError(
                    f"optimizer: {self._dp_named()} has no open privacy-ledger phase: {state.closed_by}, "
                    "which closed it. A model's privacy ledger has one holder, so two DP optimizers cannot "
                    "take turns on one model's steps. Train every trainable variable with one DP optimizer "
                    "(minimize over model.trainable_variables), or train the parts in separate runs: "
                    "begin_training, one optimizer's steps, then begin_training of the other.")
            if not state.has_open_phase:
                raise ValueError(
                    "optimizer: no privacy-ledger phase is open, so the steps about to run could not be "
                    "accounted. model.fit opens one; in a custom training loop call "
                    "optimizer.begin_training(model, dataset_or_x, y) before the first step.")
            source = attributes.ledger_state(self).open_description()["source"]
            if not self._dp_in_fit and source not in self._OUTSIDE_FIT_SOURCES:
                raise ValueError(
                    "optimizer: this step runs outside model.fit, but the open privacy-ledger phase is the "
                    f"last fit's ({describe_source(source)}); counted there, its batch would be pooled into "
                    "that fit's passes or sampling, which it was not drawn by. Call "
                    "optimizer.begin_training(model, dataset_or_x, y) before a custom training loop "
                    "(minimize, dp_train_step or the mechanism), then every step counts as one "
                    "participation of every example.")

    def get_gradients(self, loss, params):
        """Refused: graph-mode gradients would bypass per-example clipping."""
        raise ValueError("loss/params: graph-mode get_gradients is not supported by tfdpbnn DP optimizers; "
                         "use model.fit or optimizer.minimize(per_example_loss, var_list, tape=tape)")
