"""Throughput of DP training against non-private Keras, same models and data, one process.

For each model the non-private run and the DP runs are timed in alternation (one epoch each, ``--repeats``
times, after a warm-up epoch), so load from other processes hits both alike; the report gives the median
examples/s and the ratio DP time / non-private time. Peak memory: each system runs once more in a fresh
subprocess (warm-up + one epoch); its peak resident memory (VmHWM) and the increment over the resident
memory just before training are reported (CPU: TensorFlow exposes no allocator statistics). A third
measurement times the clipping engine alone (bare steps, no noise), to separate it from the optimizers.

    python benchmarks/throughput.py --repeats 3 --jacobian-steps 1   # the run in docs/benchmarks.md
    python benchmarks/throughput.py --quick --no-write   # a smoke run
    python benchmarks/throughput.py --keras-sets .venv/bin/python .venv-keras3/bin/python   # Keras 2 vs 3

``--keras-sets PY2 PY3`` runs this script (tfdpbnn systems only, no memory probes) under the Keras 2 set's
and the Keras 3 set's Python in turn, each in its own subprocess, for ``--rounds`` alternating rounds, and
reports per model and system the median examples/s, wall and CPU seconds per epoch on each Keras, with the
1-minute load average before and after (the section between the keras-sets markers of docs/benchmarks.md).

Systems: non-private Keras SGD; tf-privacy ``VectorizedDPKerasSGDOptimizer`` (per-example jacobian, a few
steps); tf-privacy ``DPSequential`` with its fast-clipping layer registry (Dense/Embedding only, so the MLP);
and the tfdpbnn optimizers through ``model.compile``/``model.fit`` (ghost clipping engine, "auto").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from importlib import metadata

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfdpbnn  # noqa: E402
import tfdpbnn.layers as L  # noqa: E402
from tfdpbnn import _keras_version  # noqa: E402
from tfdpbnn._private_api import VECTORIZED_OPTIMIZERS, tensorflow_privacy_module  # noqa: E402

CLIP, SIGMA, LR = 1.0, 1.0, 0.05


def sgd(learning_rate):
    """The non-private SGD: Keras 2's legacy SGD (as tf-privacy's optimizers), Keras 3's SGD on Keras 3."""
    if _keras_version.KERAS_MAJOR == 2:
        return tf.keras.optimizers.legacy.SGD(learning_rate)
    return tf.keras.optimizers.SGD(learning_rate)


# ------------------------------------------------------------------------------------------------- models
def mlp(n):
    """The DP-SGD paper's 784-1000-10 ReLU MLP (Abadi et al. 2016)."""
    return [tf.keras.Input((784,)), tf.keras.layers.Dense(1000, activation="relu"), tf.keras.layers.Dense(10)]


def vd_mlp(n):
    """DPVD's 784-1000-10 network of DenseVariational layers (Ermis & Cemgil 2017a)."""
    return [tf.keras.Input((784,)), L.DenseVariational(1000, num_examples=n, activation="relu"),
            L.DenseVariational(10, num_examples=n)]


def bbp_mlp(n):
    """DP-BBP's 784-1000-10 network of DenseBayesByBackprop layers (Zhang et al. 2022)."""
    return [tf.keras.Input((784,)), L.DenseBayesByBackprop(1000, num_examples=n, activation="relu"),
            L.DenseBayesByBackprop(10, num_examples=n)]


def mcdropout_mlp(n):
    """DP-MC Dropout's 784-1000-MCDropout(0.5)-10 network (Zhang et al. 2022)."""
    return [tf.keras.Input((784,)), tf.keras.layers.Dense(1000, activation="relu"), L.MCDropout(0.5),
            tf.keras.layers.Dense(10)]


def noisy_ln_mlp(n):
    """SI-DPSGD's 784-1000-LayerNorm-10 network of NoisyDense layers (Davody et al. 2020)."""
    return [tf.keras.Input((784,)), L.NoisyDense(1000), tf.keras.layers.LayerNormalization(),
            tf.keras.layers.Activation("relu"), L.NoisyDense(10)]


def cnn(n):
    """A conv16-pool-conv32-pool-10 CNN on 28x28 images."""
    return [tf.keras.Input((28, 28, 1)), tf.keras.layers.Conv2D(16, 3, activation="relu"),
            tf.keras.layers.MaxPool2D(), tf.keras.layers.Conv2D(32, 3, activation="relu"),
            tf.keras.layers.MaxPool2D(), tf.keras.layers.Flatten(), tf.keras.layers.Dense(10)]


def dp_kwargs(n, batch):
    """The DP arguments every tfdpbnn optimizer of the benchmark gets."""
    return dict(num_examples=n, batch_size=batch)


# (model key, description, layer builder, input shape, {system: optimizer factory})
def tfdpbnn_opt(cls, **extra):
    """A factory of ``cls`` optimizers with the benchmark's DP arguments."""
    def make(n, batch):
        if cls is tfdpbnn.DPSGLDOptimizer:
            return cls(CLIP, learning_rate=1e-4, **dp_kwargs(n, batch), **extra)
        return cls(CLIP, SIGMA, learning_rate=LR, **dp_kwargs(n, batch), **extra)
    return make


MODELS = {
    "mlp": ("DP-SGD, 784-1000-10 ReLU MLP", mlp, (784,),
            {"tfdpbnn DP-SGD": tfdpbnn_opt(tfdpbnn.DPSGDOptimizer)}),
    "dpvd": ("DPVD, DenseVariational 784-1000-10", vd_mlp, (784,),
             {"tfdpbnn DPVD": tfdpbnn_opt(tfdpbnn.DPVDOptimizer)}),
    "dpbbp": ("DP-BBP, DenseBayesByBackprop 784-1000-10", bbp_mlp, (784,),
              {"tfdpbnn DP-BBP": tfdpbnn_opt(tfdpbnn.DPSGDOptimizer)}),
    "dpmcdropout": ("DP-MC Dropout, 784-1000-MCDropout(0.5)-10", mcdropout_mlp, (784,),
                    {"tfdpbnn DP-MC Dropout": tfdpbnn_opt(tfdpbnn.DPSGDOptimizer)}),
    "sidp": ("SI-DPSGD, NoisyDense 784-1000-LN-10", noisy_ln_mlp, (784,),
             {"tfdpbnn SI-DPSGD": tfdpbnn_opt(tfdpbnn.SIDPOptimizer)}),
    "dpsgld": ("DP-SGLD, 784-1000-10 ReLU MLP", mlp, (784,),
               {"tfdpbnn DP-SGLD": tfdpbnn_opt(tfdpbnn.DPSGLDOptimizer)}),
    "cnn": ("DP-SGD, CNN conv16-pool-conv32-pool-10 on 28x28", cnn, (28, 28, 1),
            {"tfdpbnn DP-SGD": tfdpbnn_opt(tfdpbnn.DPSGDOptimizer)}),
}


def data(shape, n, seed=0):
    """Random inputs of ``shape`` and 10-class labels, ``n`` examples."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, size=(n, *shape)).astype("float32")
    y = rng.integers(0, 10, size=n).astype("int32")
    return x, y


def build(key, system, n, batch):
    """A compiled model for ``system``.

    ``system``: "non-private", "tf-privacy vectorized", "tf-privacy DPSequential", or one of the model's
    tfdpbnn systems.
    """
    tf.keras.utils.set_random_seed(1)
    _, layers_fn, _, systems = MODELS[key]
    layers = layers_fn(n)
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    if system == "tf-privacy DPSequential":
        layer_registry = tensorflow_privacy_module(
            "tensorflow_privacy.privacy.fast_gradient_clipping.layer_registry")
        DPSequential = tensorflow_privacy_module(  # noqa: N806 - tensorflow-privacy's class
            "tensorflow_privacy.privacy.keras_models.dp_keras_model").DPSequential
        model = DPSequential(l2_norm_clip=CLIP, noise_multiplier=SIGMA,
                             layer_registry=layer_registry.make_default_layer_registry(), layers=layers)
        model.compile(optimizer=sgd(LR), loss=loss)
        return model
    model = tf.keras.Sequential(layers)
    if system == "non-private":
        opt = sgd(LR)
    elif system == "tf-privacy vectorized":
        vectorized = tensorflow_privacy_module(VECTORIZED_OPTIMIZERS)
        opt = vectorized.VectorizedDPKerasSGDOptimizer(l2_norm_clip=CLIP, noise_multiplier=SIGMA,
                                                       learning_rate=LR)
        loss = tf.keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction=tf.keras.losses.Reduction.NONE)
    else:
        opt = systems[system](n, batch)
    model.compile(optimizer=opt, loss=loss)
    return model


def systems_for(key, with_baselines):
    """The systems timed for model ``key`` (non-private first)."""
    systems = ["non-private"] + list(MODELS[key][3])
    if with_baselines and key == "mlp":
        systems += ["tf-privacy DPSequential", "tf-privacy vectorized"]
    return systems


class _EpochTimer(tf.keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.start, self.cpu_start = time.perf_counter(), time.process_time()

    def on_epoch_end(self, epoch, logs=None):
        self.seconds = time.perf_counter() - self.start
        self.cpu_seconds = time.process_time() - self.cpu_start


def dataset(x, y, batch):
    """A batched, cached ``tf.data`` pipeline of passes over ``(x, y)``, asserted as such.

    The DP optimizers refuse a pipeline whose sampling they cannot see (``tfdpbnn.data.assert_sampling``).
    """
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True).cache().prefetch(2)
    return tfdpbnn.data.assert_sampling(ds, "shuffle", num_examples=len(x))


def run_epoch(model, ds, cpu=None):
    """Wall seconds of one ``model.fit`` epoch over ``ds``; its CPU seconds (all threads) go to ``cpu``."""
    timer = _EpochTimer()
    model.fit(ds, epochs=1, verbose=0, callbacks=[timer])
    if cpu is not None:
        cpu.append(timer.cpu_seconds)
    return timer.seconds


def time_model(key, args):
    """Interleaved timing of every system of ``key``.

    Returns ``({system: [wall seconds per epoch]}, examples/epoch, {system: [CPU seconds per epoch]})``.
    """
    shape = MODELS[key][2]
    x, y = data(shape, args.examples)
    ds = dataset(x, y, args.batch_size)
    steps = args.examples // args.batch_size
    slow = "tf-privacy vectorized"
    systems = systems_for(key, not args.no_baselines)
    models = {s: build(key, s, args.examples, args.batch_size) for s in systems}
    small = dataset(x[: args.batch_size * args.jacobian_steps], y[: args.batch_size * args.jacobian_steps],
                    args.batch_size)
    times = {s: [] for s in systems}
    cpu = {s: [] for s in systems}
    one = dataset(x[: args.batch_size], y[: args.batch_size], args.batch_size)
    for s, m in models.items():                       # warm-up: tracing and first-epoch effects
        run_epoch(m, one if s == slow else ds)
    for _ in range(args.repeats):
        for s, m in models.items():
            if s == slow:
                times[s].append(run_epoch(m, small) * steps / args.jacobian_steps)
            else:
                times[s].append(run_epoch(m, ds, cpu[s]))
    return times, steps * args.batch_size, cpu


def _proc_status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def memory_probe(key, system, args):
    """(peak RSS MiB, peak minus RSS before training MiB) over a warm-up epoch and one epoch (subprocess)."""
    x, y = data(MODELS[key][2], args.examples)
    model = build(key, system, args.examples, args.batch_size)
    n = args.batch_size * args.jacobian_steps if system == "tf-privacy vectorized" else args.examples
    ds = dataset(x[:n], y[:n], args.batch_size)
    with open("/proc/self/clear_refs", "w") as f:   # reset VmHWM (peak RSS) to the current RSS
        f.write("5")
    before = _proc_status_kib("VmRSS")
    run_epoch(model, ds)
    run_epoch(model, ds)
    peak = _proc_status_kib("VmHWM")
    return peak / 1024.0, (peak - before) / 1024.0


def measure_memory(key, system, args):
    """Run ``memory_probe`` in a fresh subprocess; (peak MiB, increment MiB)."""
    cmd = [sys.executable, __file__, "--probe", key, system, "--examples", str(args.examples),
           "--batch-size", str(args.batch_size), "--jacobian-steps", str(args.jacobian_steps)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return tuple(float(v) for v in out.stdout.strip().splitlines()[-1].split())


def engine_overhead(key, args):
    """Seconds per step of a bare non-private step and a bare ghost-clipping step (no noise, no metrics).

    Both are ``tf.function`` steps on the same model and batch, interleaved: forward + gradient + SGD apply,
    against ``tfdpbnn.clipping.clipped_gradients`` (method "auto") + SGD apply of the clipped sum. This
    isolates the clipping engine from the optimizer's noise generation and logging.
    """
    from tfdpbnn.clipping import clipped_gradients

    x, y = data(MODELS[key][2], args.batch_size)
    model = build(key, "non-private", args.examples, args.batch_size)
    opt = sgd(LR)
    variables = model.trainable_variables

    def loss_fn(yt, yp, sw):
        return tf.keras.losses.sparse_categorical_crossentropy(yt, yp, from_logits=True)

    @tf.function
    def plain(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_fn(y, model(x, training=True), None))
            if model.losses:
                loss += tf.add_n(model.losses)
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))

    @tf.function
    def ghost(x, y):
        r = clipped_gradients(model, x, y, None, loss_fn, CLIP, var_list=variables)
        grads = [c / args.batch_size + g for c, g in zip(r.clipped_sum, r.regularization_grads, strict=True)]
        opt.apply_gradients(zip(grads, variables, strict=True))

    times = {"plain": [], "ghost": []}
    x, y = tf.constant(x), tf.constant(y)   # arguments, not captured constants (no constant folding)
    for f in (plain, ghost):
        f(x, y)
        f(x, y)
    for _ in range(args.repeats * 4):
        for name, f in (("plain", plain), ("ghost", ghost)):
            start = time.perf_counter()
            f(x, y)
            times[name].append(time.perf_counter() - start)
    return statistics.median(times["plain"]), statistics.median(times["ghost"])


def noise_cost(key, args):
    """Milliseconds per step to draw the DP noise for every trainable variable of ``key``'s model.

    One ``tf.random.normal`` per variable (what the optimizers did before) against the fused Box-Muller draw
    they use (``tfdpbnn.privacy.noise.gaussian_noise_like``), seeded by TensorFlow's generator and in
    secure mode (``os.urandom`` each step); interleaved bare ``tf.function`` calls.
    """
    from tfdpbnn.privacy.noise import gaussian_noise_like

    variables = build(key, "non-private", args.examples, args.batch_size).trainable_variables
    stddev = tf.Variable(SIGMA * CLIP / args.batch_size)

    @tf.function
    def per_variable():
        return [tf.random.normal(v.shape, stddev=stddev) for v in variables]

    @tf.function
    def fused():
        return gaussian_noise_like(variables, stddev, secure=False)

    @tf.function
    def secure():
        return gaussian_noise_like(variables, stddev, secure=True)

    forward, forward_backward = _largest_layer_steps(key, args)
    draws = {"normal": per_variable, "fused": fused, "secure": secure, "forward": forward,
             "forward_backward": forward_backward}
    times = {name: [] for name in draws}
    for f in draws.values():
        f()
        f()
    for _ in range(args.repeats * 6):
        for name, f in draws.items():
            start = time.perf_counter()
            [t.numpy() for t in f()]
            times[name].append(time.perf_counter() - start)
    size = sum(int(v.shape.num_elements()) for v in variables)
    medians = {name: statistics.median(t) for name, t in times.items()}
    backward = max(0.0, medians["forward_backward"] - medians["forward"])
    return (size, medians["normal"], medians["fused"], medians["secure"], backward)


def _largest_layer_steps(key, args):
    """Bare ``tf.function`` forward, and forward + backward, of the model's largest layer on one batch.

    The backward pass of the largest layer, what the DP noise is compared with, is their difference: the
    gradient of ``sum(outputs^2) / 2`` with respect to the layer's trainable weights (and to its input,
    unless it is the model's first layer, whose input gradient Keras never computes). The upstream gradient
    is the layer's own output, so the backward pass waits for the forward pass (as in training) instead of
    running beside it.
    """
    model = build(key, "non-private", args.examples, args.batch_size)
    layer = max(model.layers, key=lambda lay: sum(int(v.shape.num_elements()) for v in lay.trainable_weights))
    first = layer is model.layers[0]
    x, _ = data(MODELS[key][2], args.batch_size)
    inputs = tf.constant(tf.keras.Model(model.inputs, layer.input)(x))

    @tf.function
    def forward():
        return [layer(inputs, training=True)]

    @tf.function
    def forward_backward():
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            loss = 0.5 * tf.reduce_sum(tf.square(layer(inputs, training=True)))
        return tape.gradient(loss, layer.trainable_weights + ([] if first else [inputs]))

    return forward, forward_backward


# ------------------------------------------------------------------------------------------------- report
def report(results, args):
    """Write the Markdown report (docs/benchmarks.md) from the measurements."""
    lines = [
        "# Throughput: DP training vs non-private Keras",
        "",
        "Generated by `python benchmarks/throughput.py` "
        f"(`--examples {args.examples} --batch-size {args.batch_size} --repeats {args.repeats} "
        f"--jacobian-steps {args.jacobian_steps}{' --no-baselines' if args.no_baselines else ''}"
        f"{' --no-memory' if args.no_memory else ''}`, wall time {time.perf_counter() - START:.0f} s). "
        "Random MNIST-shaped data; each system trained with "
        "`model.compile`/`model.fit` on the same batches; median of the timed epochs after a warm-up epoch, "
        "the non-private and DP epochs interleaved in one process. tfdpbnn optimizers use the ghost clipping "
        "engine (`tfdpbnn.clipping`, method \"auto\"); tf-privacy's vectorized (jacobian) optimizer is "
        f"timed on {args.jacobian_steps} steps per repeat and scaled to an epoch.",
        "",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, TensorFlow "
        f"{tf.__version__}. 1-minute load average when the run started: {LOAD_AT_START:.2f} (anything "
        "near the core count means other work competed with this run: absolute rates are then noisy, and "
        "the interleaved ratios are the meaningful part)."
        + (" This run's load was above the core count: even the ratios are unreliable (a ratio below 1.00x "
           "is a load artifact), and the targets below are no verdict; rerun on an idle machine."
           if (os.cpu_count() or 1) < LOAD_AT_START else ""),
        "",
        "Time ratio = DP seconds per epoch / non-private seconds per epoch of the same model (medians). "
        "Memory: each system once more in a fresh process (warm-up epoch + one epoch): peak resident memory "
        "(VmHWM) of the process, and the training increment = peak minus the resident memory just before "
        "training (model and data built); the memory ratio compares increments.",
        "",
        "| model | system | examples/s | time ratio | peak RSS MiB | training increment MiB | memory ratio |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for key, (times, examples, memory, _, _) in results.items():
        base = statistics.median(times["non-private"])
        base_mem = memory.get("non-private")
        for system, ts in times.items():
            med = statistics.median(ts)
            mem = memory.get(system)
            mem_s = f"{mem[0]:.0f} | {mem[1]:.0f}" if mem is not None else "- | -"
            mem_r = f"{mem[1] / max(base_mem[1], 1.0):.2f}" if mem is not None and base_mem else "-"
            lines.append(f"| {MODELS[key][0]} | {system} | {examples / med:,.0f} | {med / base:.2f}x | "
                         f"{mem_s} | {mem_r} |")
    lines += [
        "",
        "## The clipping engine alone",
        "",
        "Bare `tf.function` steps on one batch, interleaved: non-private forward + gradient + SGD apply, "
        "against `tfdpbnn.clipping.clipped_gradients` + SGD apply of the clipped sum (no noise, no metrics, "
        "no privacy logs). The difference to the table above is what the optimizers add per step (Gaussian "
        "noise for every parameter, DPVD's alpha median, logs).",
        "",
        "| model | non-private step ms | ghost-clipping step ms | ratio |",
        "| --- | ---: | ---: | ---: |",
    ]
    for key, (_, _, _, engine, _) in results.items():
        if engine is not None:
            lines.append(f"| {MODELS[key][0]} | {engine[0] * 1e3:.1f} | {engine[1] * 1e3:.1f} | "
                         f"{engine[1] / engine[0]:.2f}x |")
    lines += [
        "",
        "## The noise alone",
        "",
        "Drawing N(0, (sigma C / B)^2) for every trainable parameter, bare `tf.function` calls interleaved: "
        "one `tf.random.normal` per variable against the fused vectorized Box-Muller draw the optimizers use "
        "(`tfdpbnn/privacy/noise.py`: radius from up to 128 random bits, so no value is cut below "
        "13.37 sigma C; `tf.random.normal`'s float32 draw stops near 5.7 sigma C), seeded from TensorFlow's "
        "generator, and the same draw in secure mode (128 bits of `os.urandom` per step). Beside it, the "
        "non-private backward pass of the model's largest layer on one batch (bare forward + backward minus "
        "bare forward; weight gradients, and the input gradient unless it is the first layer).",
        "",
        "| model | parameters | tf.random.normal ms | fused Box-Muller ms | secure mode ms | speed-up | "
        "largest layer's backward ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for key, result in results.items():
        noise = result[4]
        if noise is not None:
            size, normal, fused, secure, backward = noise
            lines.append(f"| {MODELS[key][0]} | {size:,} | {normal * 1e3:.2f} | {fused * 1e3:.2f} | "
                         f"{secure * 1e3:.2f} | {normal / fused:.2f}x | {backward * 1e3:.2f} |")
    lines += targets(results)
    lines += overhead_breakdown(results, args)
    lines += ["", "Raw seconds per epoch (interleaved runs):", "", "```", json.dumps(
        {k: {s: [round(t, 4) for t in ts] for s, ts in v[0].items()} for k, v in results.items()}, indent=1),
        "```", ""]
    return "\n".join(lines)


#: Recorded at import, before this script adds any load of its own.
LOAD_AT_START = os.getloadavg()[0]
START = time.perf_counter()
DENSE_MLPS = ("mlp", "dpsgld")   # target 1.15x; every other model (Bayesian, noisy, CNN) 1.3x


def targets(results):
    """The speed and memory targets, each marked met / missed from the measurements above."""
    def mark(ok):
        return "met" if ok else "**missed**"

    lines = ["", "## Targets", "", "| target | measured | status |", "| --- | --- | --- |"]
    for key, (times, _, memory, _, noise) in results.items():
        if noise is not None:
            ok = mark(noise[2] <= noise[4])
            lines.append(f"| noise for every parameter of {key} <= its largest layer's backward pass | "
                         f"{noise[2] * 1e3:.2f} ms vs {noise[4] * 1e3:.2f} ms | {ok} |")
        base = statistics.median(times["non-private"])
        limit = 1.15 if key in DENSE_MLPS else 1.3
        for system in MODELS[key][3]:
            ratio = statistics.median(times[system]) / base
            lines.append(f"| {system} on {key}: time <= {limit}x non-private | {ratio:.2f}x | "
                         f"{mark(ratio <= limit)} |")
            if system in memory and "non-private" in memory:
                mem = memory[system][1] / max(memory["non-private"][1], 1.0)
                lines.append(f"| {system} on {key}: memory increment <= 1.5x non-private | {mem:.2f}x | "
                             f"{mark(mem <= 1.5)} |")
    if "mlp" in results:
        times = results["mlp"][0]
        ours = statistics.median(times["tfdpbnn DP-SGD"])
        if "tf-privacy vectorized" in times:
            speedup = statistics.median(times["tf-privacy vectorized"]) / ours
            lines.append(f"| >= 100x faster than the jacobian path (MLP, batch 600) | {speedup:.0f}x | "
                         f"{mark(speedup >= 100)} |")
        if "tf-privacy DPSequential" in times:
            speedup = statistics.median(times["tf-privacy DPSequential"]) / ours
            lines.append(f"| faster than tf-privacy DPSequential (MLP) | {speedup:.2f}x | "
                         f"{mark(speedup > 1)} |")
    return lines


def overhead_breakdown(results, args):
    """Where a DP step's extra time goes: the noise draw and the clipping engine, per model (milliseconds)."""
    lines = ["", "## Where the DP step's extra time goes", "",
             f"Per step (batch {args.batch_size}): the non-private and DP `fit` steps (epoch medians "
             "divided by the steps per epoch), their difference, and the two measured parts of it: the "
             "noise draw (section above) and the clipping engine's extra time over a plain step (bare "
             "steps, section above). What is left is logging and Keras's bookkeeping.", "",
             "| model | non-private ms | DP ms | extra ms | noise ms | clipping engine extra ms |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for key, (times, examples, _, engine, noise) in results.items():
        steps = max(1, examples // args.batch_size)
        base = statistics.median(times["non-private"]) / steps
        for system in MODELS[key][3]:
            dp = statistics.median(times[system]) / steps
            engine_extra = "" if engine is None else f"{(engine[1] - engine[0]) * 1e3:.1f}"
            noise_ms = "" if noise is None else f"{noise[2] * 1e3:.1f}"
            extra = (dp - base) * 1e3
            lines.append(f"| {system} on {key} | {base * 1e3:.1f} | {dp * 1e3:.1f} | {extra:.1f} | "
                         f"{noise_ms} | {engine_extra} |")
    return lines


def main(argv=None):
    """Parse the arguments, run the measurements and print or write the report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", type=int, default=6000)
    parser.add_argument("--batch-size", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--jacobian-steps", type=int, default=2)
    parser.add_argument("--models", default=",".join(MODELS),
                        help="comma-separated subset of " + ",".join(MODELS))
    parser.add_argument("--no-baselines", action="store_true", help="skip the tf-privacy systems")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory subprocesses")
    parser.add_argument("--quick", action="store_true", help="1200 examples, 2 repeats (smoke run)")
    parser.add_argument("--no-write", action="store_true", help="print only; do not write docs/benchmarks.md")
    parser.add_argument("--out",
                        default=os.path.join(os.path.dirname(__file__), "..", "docs", "benchmarks.md"))
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="also write the timings (model -> system -> median examples/s, time ratio) as "
                             "JSON (benchmarks/tf_versions.py reads it)")
    parser.add_argument("--keras-sets", nargs=2, metavar=("PYTHON_KERAS2", "PYTHON_KERAS3"),
                        help="compare the Keras 2 and Keras 3 sets: run this script under each Python "
                             "(module docstring)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of --keras-sets")
    parser.add_argument("--probe", nargs=2, metavar=("MODEL", "SYSTEM"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.examples, args.repeats, args.jacobian_steps = 1200, 2, 1
    for value, name in ((args.examples, "--examples"), (args.batch_size, "--batch-size"),
                        (args.repeats, "--repeats"), (args.jacobian_steps, "--jacobian-steps"),
                        (args.rounds, "--rounds")):
        if value < 1:
            raise SystemExit(f"{name} must be >= 1, got {value}")
    if args.examples < args.batch_size:
        raise SystemExit(f"--examples must be >= --batch-size ({args.batch_size}), got {args.examples}")
    if args.probe:
        print(*memory_probe(args.probe[0], args.probe[1], args))
        return 0
    keys = [k for k in args.models.split(",") if k]
    for k in keys:
        if k not in MODELS:
            raise SystemExit(f"--models: unknown model {k!r}; choose from {', '.join(MODELS)}")
    if args.keras_sets:
        return compare_keras_sets(args, keys)
    results, cpu_by_key = {}, {}
    for key in keys:
        times, examples, cpu = time_model(key, args)
        cpu_by_key[key] = cpu
        memory = {}
        if not args.no_memory:
            for system in times:
                memory[system] = measure_memory(key, system, args)
        engine = engine_overhead(key, args)
        noise = noise_cost(key, args)
        results[key] = (times, examples, memory, engine, noise)
        base = statistics.median(times["non-private"])
        for system, ts in times.items():
            med = statistics.median(ts)
            mem = f", peak {memory[system][0]:.0f} MiB (+{memory[system][1]:.0f})" if system in memory else ""
            print(f"{key:12s} {system:26s} {examples / med:10,.0f} ex/s  {med / base:7.2f}x{mem}", flush=True)
        print(f"{key:12s} engine alone: {engine[0] * 1e3:.1f} ms vs {engine[1] * 1e3:.1f} ms per step "
              f"({engine[1] / engine[0]:.2f}x); noise for {noise[0]:,} parameters: tf.random.normal "
              f"{noise[1] * 1e3:.2f} ms, fused {noise[2] * 1e3:.2f} ms, secure {noise[3] * 1e3:.2f} ms; "
              f"largest layer's backward {noise[4] * 1e3:.2f} ms",
              flush=True)
    if args.json:
        summary = {}
        for key, (times, examples, _, _, _) in results.items():
            base = statistics.median(times["non-private"])
            summary[key] = {system: {"examples_per_s": examples / statistics.median(ts),
                                     "time_ratio": statistics.median(ts) / base,
                                     "wall_s_per_epoch": statistics.median(ts),
                                     "cpu_s_per_epoch": (statistics.median(cpu_by_key[key][system])
                                                         if cpu_by_key[key][system] else None)}
                            for system, ts in times.items()}
        with open(args.json, "w") as f:
            json.dump({"tensorflow": tf.__version__, "keras_major": _keras_version.KERAS_MAJOR,
                       "keras": metadata.version(_keras_version.KERAS_PACKAGE.replace("_", "-")),
                       "results": summary}, f, indent=1)
    text = report(results, args)
    if not args.no_write:
        # Keep the sections benchmarks/scaling.py, tf_versions.py and epsilon_cost.py wrote between markers.
        old = ""
        if os.path.exists(args.out):
            with open(args.out) as f:
                old = f.read()
        for name in ("scaling", "tf-versions", "keras-sets", "epsilon-cost"):
            begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
            if begin in old and end in old:
                text = text.rstrip("\n") + "\n\n" + old[old.index(begin): old.index(end) + len(end)] + "\n"
        with open(args.out, "w") as f:
            f.write(text)
        print(f"wrote {os.path.normpath(args.out)}")
    return 0


KERAS_BEGIN, KERAS_END = "<!-- keras-sets:begin -->", "<!-- keras-sets:end -->"


def _run_set(python, args, keys):
    """This script under ``python`` (its own subprocess, tfdpbnn systems only): its ``--json`` output."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "throughput.json")
        cmd = [python, os.path.abspath(__file__), "--no-baselines", "--no-memory", "--no-write",
               "--examples", str(args.examples), "--batch-size", str(args.batch_size),
               "--repeats", str(args.repeats), "--models", ",".join(keys), "--json", out]
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
        env.pop("TF_USE_LEGACY_KERAS", None)  # tfdpbnn set it here (Keras 2); each set picks its own Keras
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
        with open(out) as f:
            return json.load(f)


def compare_keras_sets(args, keys):
    """``--keras-sets``: the same models and batches on the Keras 2 and the Keras 3 set (module docstring)."""
    from scaling import write_section

    load_before, start = os.getloadavg()[0], time.perf_counter()
    runs = {2: [], 3: []}
    versions = {}
    for r in range(args.rounds):
        for major, python in zip((2, 3), args.keras_sets, strict=True):
            data = _run_set(python, args, keys)
            if data["keras_major"] != major:
                raise SystemExit(f"--keras-sets: {python} runs Keras {data['keras_major']}, expected Keras "
                                 f"{major} (give the Keras 2 set's Python first)")
            versions[major] = f"TensorFlow {data['tensorflow']}, Keras {data['keras']}"
            runs[major].append(data["results"])
            print(f"round {r + 1}: Keras {major} ({versions[major]}): " + ", ".join(
                f"{m}/{s} {v['examples_per_s']:,.0f} ex/s" for m, systems in data["results"].items()
                for s, v in systems.items()), flush=True)
    load_after, seconds = os.getloadavg()[0], time.perf_counter() - start

    def median(major, model, system, field):
        return statistics.median(run[model][system][field] for run in runs[major])

    lines = [KERAS_BEGIN, "", "## Keras 2 and Keras 3", "",
             f"Generated by `python benchmarks/throughput.py --keras-sets .venv/bin/python "
             f".venv-keras3/bin/python --rounds {args.rounds} --examples {args.examples} --batch-size "
             f"{args.batch_size} --repeats {args.repeats} --models {','.join(keys)}` (wall time "
             f"{seconds:.0f} s): this script with `--no-baselines --no-memory` under each set's Python, "
             f"each in its own subprocess, alternating, {args.rounds} round(s); the same models, random "
             f"data and batch size {args.batch_size} on both; medians over the rounds of each run's "
             f"median epoch. Keras 2: "
             f"{versions[2]} (Python 3.11); Keras 3: {versions[3]} (Python 3.13). Machine: "
             f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores; 1-minute load "
             f"average {load_before:.2f} before and {load_after:.2f} after (near or above the core count, "
             "other work competed: wall times are then noisy; CPU seconds, summed over TensorFlow's threads, "
             "less so).", "",
             "| model | system | Keras 2 examples/s | Keras 3 examples/s | Keras 3 / Keras 2 | Keras 2 wall "
             "s / epoch | Keras 3 wall s / epoch | Keras 2 CPU s / epoch | Keras 3 CPU s / epoch |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for model in runs[2][0]:
        for system in runs[2][0][model]:
            k2, k3 = (median(m, model, system, "examples_per_s") for m in (2, 3))
            w2, w3 = (median(m, model, system, "wall_s_per_epoch") for m in (2, 3))
            c2, c3 = (median(m, model, system, "cpu_s_per_epoch") for m in (2, 3))
            lines.append(f"| {model} | {system} | {k2:,.0f} | {k3:,.0f} | {k3 / k2:.2f} | {w2:.3f} | "
                         f"{w3:.3f} | {c2:.3f} | {c3:.3f} |")
    lines += ["", KERAS_END]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_section(text, args.out, KERAS_BEGIN, KERAS_END)
        print(f"wrote {os.path.normpath(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
