"""Batch normalization with statistics from a public batch only (Davody et al.'s (2020) BN variant fixed).

docs/soundness.md, finding 1: Davody et al. (2020) (Algorithm 2) normalizes over the public batch X^
concatenated with the private batch, so one private example moves every other example's output and per-example
clipping no longer bounds sensitivity. Here the statistics come from the public examples alone, in training
and at inference:

    y = gamma * (x - mean(P)) / sqrt(var(P) + epsilon) + beta,

where P is the public batch's activation at this layer's input, computed with the same weights (and the
same weight sample for noisy layers) as the private batch. Two ways to supply P:

* stored (first layer, or after fixed preprocessing): ``PublicBatchNormalization(public_batch=x_pub)`` or
  ``set_public_batch(x_pub)``; P = x_pub.
* carried (deeper in a network): ``AppendPublicBatch(public_batch=x_pub)`` at the model input concatenates
  the public examples after the private ones along the batch axis; every layer in between processes rows
  independently; each ``PublicBatchNormalization(num_public=M, carried=True)`` takes P = the last M rows of
  its input; ``DropPublicBatch(M)`` before the outputs removes them, so losses and metrics see only the
  private examples. Layers between must not mix rows (e.g. no Keras ``BatchNormalization``).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfdpbnn import _private_api
from tfdpbnn._validation import check_positive_int, check_real
from tfdpbnn.layers import _checks


class _PublicBatchStore:
    """Holds a public batch in a non-trainable variable ``public_batch`` of shape [M, *input_shape[1:]]."""

    def _init_store(self, public_batch, num_public, public_batch_assigned=False):
        self._pending = None
        if public_batch is not None:
            arr = np.asarray(public_batch, dtype=np.float32)
            if arr.ndim < 1 or arr.shape[0] < 1:
                raise ValueError(f"public_batch: expected an array of shape [M, ...] with M >= 1, got shape "
                                 f"{arr.shape}")
            if num_public is not None and check_positive_int("num_public", num_public) != arr.shape[0]:
                raise ValueError(f"num_public must equal public_batch.shape[0] = {arr.shape[0]}, "
                                 f"got {num_public}")
            num_public = arr.shape[0]
            self._pending = arr
        elif num_public is None:
            raise ValueError("public_batch or num_public must be given (num_public: an integer >= 1)")
        self.num_public = check_positive_int("num_public", num_public)
        self._public_batch_assigned = bool(public_batch_assigned) or public_batch is not None

    def _check_public(self, arr, feature_shape):
        expected = (self.num_public,) + tuple(feature_shape)
        if arr.shape != expected:
            raise ValueError(f"public_batch: expected shape {expected} ([num_public] + this layer's input "
                             f"shape without the batch axis), got {arr.shape}")
        if not np.all(np.isfinite(arr)):
            raise ValueError("public_batch: all values must be finite")

    def _build_store(self, input_shape):
        feature_shape = tf.TensorShape(input_shape)[1:]
        if not feature_shape.is_fully_defined():
            raise ValueError(f"inputs: all dimensions but the batch axis must be known, got {input_shape}")
        self._feature_shape = tuple(feature_shape.as_list())
        self.public_batch = self.add_weight(name="public_batch",
                                            shape=(self.num_public,) + self._feature_shape,
                                            initializer="zeros", trainable=False)
        if self._pending is not None:
            self._check_public(self._pending, self._feature_shape)
            self.public_batch.assign(self._pending)
            self._pending = None

    def set_public_batch(self, x):
        """Set the public batch (shape [num_public] + the layer's input shape without the batch axis)."""
        arr = np.asarray(x, dtype=np.float32)
        if getattr(self, "public_batch", None) is None:
            if arr.ndim < 1 or arr.shape[0] != self.num_public:
                raise ValueError(f"public_batch: expected {self.num_public} examples along axis 0, got shape "
                                 f"{arr.shape}")
            self._pending = arr
        else:
            self._check_public(arr, self._feature_shape)
            self.public_batch.assign(arr)
        self._public_batch_assigned = True

    def _public_batch_config(self):
        """The public batch as nested lists for ``get_config`` (None if not assigned yet).

        The public batch is part of the layer's definition, like its arguments, not a learned weight: keeping
        it in the config lets ``from_config`` and ``tf.keras.models.clone_model`` (which re-initializes all
        weights) rebuild a layer that normalizes exactly as the original. Its size is num_public times the
        input size, so keep public batches small.
        """
        if not self._public_batch_assigned:
            return None
        if getattr(self, "public_batch", None) is not None:
            return tf.keras.backend.get_value(self.public_batch).tolist()
        return None if self._pending is None else self._pending.tolist()

    def _require_assigned(self):
        # A functional model's construction runs the layer on symbolic inputs for their shapes alone: the
        # public batch may be set afterwards (set_public_batch), before the layer computes anything.
        if not self._public_batch_assigned and not _private_api.in_symbolic_call():
            raise ValueError(f"public_batch: layer {self.name!r} has no public batch yet; pass public_batch= "
                             "to the constructor or call set_public_batch(x) first")


@tf.keras.utils.register_keras_serializable(package="tfdpbnn")
class PublicBatchNormalization(_PublicBatchStore, tf.keras.layers.Layer):
    """Batch normalization whose mean and variance come only from public examples (see module docstring).

    Args:
      public_batch: stored mode: the public batch at this layer's input, shape [M, ...]; or None.
      num_public: M. Required when ``carried=True`` or when the public batch is set later.
      carried: True if the public examples arrive as the last ``num_public`` rows of the input
        (``AppendPublicBatch`` at the model input); statistics then track the current weights of all
        earlier layers.
      axis: the feature axis (normalized per feature; statistics over all other axes of P).
    Variables: ``gamma``, ``beta`` (trainable), ``public_batch`` (stored mode, non-trainable). No moving
    averages: training and inference use the same public statistics, so no private example's output
    depends on another private example.
    """

    def __init__(self, public_batch=None, num_public=None, carried=False, axis=-1, epsilon=1e-3, center=True,
                 scale=True, beta_initializer="zeros", gamma_initializer="ones", beta_regularizer=None,
                 gamma_regularizer=None, beta_constraint=None, gamma_constraint=None,
                 public_batch_assigned=False, **kwargs):
        no_averages = ("this layer keeps no moving averages: training and inference both normalize with the "
                       "public batch's statistics, so no private example's output depends on another's")
        _checks.refuse(kwargs, {
            "momentum": no_averages, "moving_mean_initializer": no_averages,
            "moving_variance_initializer": no_averages,
            "renorm": "batch renormalization uses private batch statistics", "renorm_clipping": no_averages,
            "renorm_momentum": no_averages,
            "virtual_batch_size": "statistics come from the public batch, not from (virtual) private batches",
            "adjustment": "statistics come from the public batch only",
            "synchronized": "the public batch is the same on every replica: nothing to synchronize",
            "fused": "the normalization is computed from the public batch in plain ops"})
        super().__init__(**kwargs)
        self.carried = bool(carried)
        if self.carried and public_batch is not None:
            raise ValueError("public_batch must be None when carried=True (the public examples arrive as the "
                             "last num_public rows of the input; set them on AppendPublicBatch)")
        self._init_store(public_batch, num_public, public_batch_assigned or self.carried)
        if isinstance(axis, bool) or not isinstance(axis, int):
            raise ValueError(f"axis must be an integer, got {axis!r}")
        self.axis = axis
        self.epsilon = check_real("epsilon", epsilon, low=0.0, low_open=True)
        self.center = bool(center)
        self.scale = bool(scale)
        self.beta_initializer = tf.keras.initializers.get(beta_initializer)
        self.gamma_initializer = tf.keras.initializers.get(gamma_initializer)
        self.beta_regularizer = tf.keras.regularizers.get(beta_regularizer)
        self.gamma_regularizer = tf.keras.regularizers.get(gamma_regularizer)
        self.beta_constraint = tf.keras.constraints.get(beta_constraint)
        self.gamma_constraint = tf.keras.constraints.get(gamma_constraint)

    def build(self, input_shape):
        """Create ``gamma``/``beta`` along the normalized axis and, in stored mode, the public batch store."""
        input_shape = tf.TensorShape(input_shape)
        rank = input_shape.rank
        axis = self.axis + rank if self.axis < 0 else self.axis
        if not 1 <= axis < rank:
            raise ValueError(f"axis must index a non-batch axis of the {rank}-D input, got {self.axis}")
        self._axis = axis
        dim = input_shape[axis]
        if dim is None:
            raise ValueError(f"inputs: the normalized axis {self.axis} must have a known size")
        self._reduce_axes = [a for a in range(rank) if a != axis]
        param_shape = [1] * rank
        param_shape[axis] = int(dim)
        self._param_shape = param_shape
        self.gamma = self.add_weight(name="gamma", shape=(int(dim),), initializer=self.gamma_initializer,
                                     regularizer=self.gamma_regularizer, constraint=self.gamma_constraint,
                                     trainable=True) if self.scale else None
        self.beta = self.add_weight(name="beta", shape=(int(dim),), initializer=self.beta_initializer,
                                    regularizer=self.beta_regularizer, constraint=self.beta_constraint,
                                    trainable=True) if self.center else None
        if not self.carried:
            self._build_store(input_shape)
        super().build(input_shape)

    def set_public_batch(self, x):
        """Stored mode only: set the public batch at this layer's input."""
        if self.carried:
            raise ValueError("set_public_batch: this layer has carried=True; set the public batch on the "
                             "model's AppendPublicBatch layer instead")
        super().set_public_batch(x)

    def public_statistics(self, inputs=None):
        """(mean, variance) of the public batch, shaped to broadcast against the input."""
        if self.carried:
            public = inputs[-self.num_public:]
        else:
            self._require_assigned()
            public = tf.cast(self.public_batch, inputs.dtype if inputs is not None else tf.float32)
        mean, var = tf.nn.moments(public, axes=self._reduce_axes, keepdims=True)
        return mean, var

    @property
    def feature_axis(self) -> int:
        """The normalized axis as a non-negative index (set by ``build``); gamma and beta live along it."""
        return self._axis

    def normalize(self, inputs):
        """``xhat = (x - mean_P) / sqrt(var_P + epsilon)`` with the public statistics.

        ``call`` returns ``scale_and_shift(xhat)``; the clipping rule reads ``xhat`` for gamma's per-example
        gradients.
        """
        inputs = tf.convert_to_tensor(inputs)
        mean, var = self.public_statistics(inputs)
        return (inputs - mean) * tf.math.rsqrt(var + self.epsilon)

    def scale_and_shift(self, xhat):
        """``gamma xhat + beta`` (each only if the layer has it), broadcast along ``feature_axis``."""
        outputs = xhat
        if self.scale:
            outputs = outputs * tf.reshape(tf.cast(self.gamma, xhat.dtype), self._param_shape)
        if self.center:
            outputs = outputs + tf.reshape(tf.cast(self.beta, xhat.dtype), self._param_shape)
        return outputs

    def call(self, inputs, training=None):
        """``scale_and_shift(normalize(inputs))``: the same public statistics in training and inference."""
        return self.scale_and_shift(self.normalize(inputs))

    def compute_output_shape(self, input_shape):
        """The input shape (normalization keeps it)."""
        return tf.TensorShape(input_shape)

    def get_config(self):
        """The constructor arguments (and, in stored mode, the public batch), for Keras serialization."""
        config = super().get_config()
        ser = tf.keras.initializers.serialize
        if not self.carried:
            config["public_batch"] = self._public_batch_config()
        config.update({"num_public": self.num_public, "carried": self.carried, "axis": self.axis,
                       "epsilon": self.epsilon, "center": self.center, "scale": self.scale,
                       "beta_initializer": ser(self.beta_initializer),
                       "gamma_initializer": ser(self.gamma_initializer),
                       "beta_regularizer": tf.keras.regularizers.serialize(self.beta_regularizer),
                       "gamma_regularizer": tf.keras.regularizers.serialize(self.gamma_regularizer),
                       "beta_constraint": tf.keras.constraints.serialize(self.beta_constraint),
                       "gamma_constraint": tf.keras.constraints.serialize(self.gamma_constraint)})
        return config


@tf.keras.utils.register_keras_serializable(package="tfdpbnn")
class AppendPublicBatch(_PublicBatchStore, tf.keras.layers.Layer):
    """Concatenate a stored public batch after the private rows (input of the carried mode).

    The carried mode of Davody et al. (2020, Alg. 2).

    Variable: ``public_batch`` (non-trainable, [num_public, *input_shape[1:]]). Output batch size is
    batch + num_public; end the network with ``DropPublicBatch(num_public)``.
    """

    def __init__(self, public_batch=None, num_public=None, public_batch_assigned=False, **kwargs):
        super().__init__(**kwargs)
        self._init_store(public_batch, num_public, public_batch_assigned)

    def build(self, input_shape):
        """Create the non-trainable ``public_batch`` variable for this input shape."""
        self._build_store(input_shape)
        super().build(input_shape)

    def call(self, inputs):
        """``inputs`` followed by the public batch along axis 0; raises if no public batch was set."""
        inputs = tf.convert_to_tensor(inputs)
        self._require_assigned()
        return tf.concat([inputs, tf.cast(self.public_batch, inputs.dtype)], axis=0)

    def compute_output_shape(self, input_shape):
        """The input shape, as given (the batch dimension is not increased by ``num_public`` here)."""
        return tf.TensorShape(input_shape)

    def get_config(self):
        """The config with ``num_public`` and the public batch, for Keras serialization."""
        config = super().get_config()
        config.update({"num_public": self.num_public, "public_batch": self._public_batch_config()})
        return config


@tf.keras.utils.register_keras_serializable(package="tfdpbnn")
class DropPublicBatch(tf.keras.layers.Layer):
    """Remove the last ``num_public`` rows (the public examples appended by ``AppendPublicBatch``)."""

    def __init__(self, num_public, **kwargs):
        super().__init__(**kwargs)
        self.num_public = check_positive_int("num_public", num_public)

    def call(self, inputs):
        """``inputs`` without its last ``num_public`` rows."""
        return inputs[:-self.num_public]

    def compute_output_shape(self, input_shape):
        """The input shape, as given (the batch dimension is not reduced by ``num_public`` here)."""
        return tf.TensorShape(input_shape)

    def get_config(self):
        """The config with ``num_public``, for Keras serialization."""
        config = super().get_config()
        config.update({"num_public": self.num_public})
        return config
