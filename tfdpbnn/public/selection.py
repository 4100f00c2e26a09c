"""Hyperparameters chosen on public data: the search sees no private record, so it costs no privacy."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from tfdpbnn._validation import check_positive_int
from tfdpbnn.public._inputs import as_dataset


@dataclasses.dataclass
class PublicSelection:
    """The chosen ``hparams``, its public validation ``score``, and every candidate's score (``scores``).

    All of it is a function of public data only: publishable, and outside any privacy statement.
    """

    hparams: dict
    score: float
    scores: list


def _accuracy(model, dataset):
    correct = total = 0
    for x, y in dataset:
        logits = model(x, training=False)
        correct += int(np.sum(np.argmax(np.asarray(logits), axis=-1) == np.asarray(y).reshape(-1)))
        total += int(np.asarray(y).shape[0])
    return correct / total


def select_on_public(build: Callable[[dict], tf.keras.Model], candidates, public_train, public_validation, *,
                     epochs: int, batch_size: int | None = None,
                     score: Callable | None = None, verbose: int = 0) -> PublicSelection:
    """Train every candidate on public data and keep the best on public validation data.

    Hyperparameter transfer from public data (Papernot & Steinke 2022 discuss what private selection
    costs; here nothing private is read, so the cost is zero). ``build(hparams)`` returns a compiled model,
    typically with the DP optimizer and noise of the planned private run, so that the public data simulate
    it. Each candidate (a dict) is fitted on ``public_train`` for ``epochs`` and scored by ``score(model,
    dataset)`` (default: accuracy of the argmax of the outputs) on ``public_validation``; ties go to the
    earlier candidate. The chosen hyperparameters then configure the private run; its privacy statement is
    unchanged. Data: ``tf.data.Dataset`` of (x, y) batches or (x, y) pairs (batched by ``batch_size``).
    """
    if not isinstance(candidates, list | tuple) or not candidates \
            or not all(isinstance(c, dict) for c in candidates):
        raise ValueError(f"candidates must be a non-empty list of dicts, got {candidates!r}")
    epochs = check_positive_int("epochs", epochs)
    train = as_dataset("public_train", public_train, batch_size)
    validation = as_dataset("public_validation", public_validation, batch_size)
    score = _accuracy if score is None else score
    scores = []
    for hparams in candidates:
        model = build(dict(hparams))
        if not isinstance(model, tf.keras.Model) or getattr(model, "optimizer", None) is None:
            raise ValueError("build must return a compiled tf.keras.Model")
        model.fit(train, epochs=epochs, verbose=verbose)
        scores.append(float(score(model, validation)))
    best = int(np.argmax(scores))
    return PublicSelection(hparams=dict(candidates[best]), score=scores[best], scores=scores)
