"""What a model's preprocessing layers release about the data: DP adapt records and public assertions.

A Keras preprocessing layer adapted on data (``Normalization``'s means and variances, ``Discretization``'s
bin boundaries, a lookup layer's vocabulary) carries statistics of that data inside the model. tfdpbnn
trusts such a layer only when its state came from a DP mechanism (``private_adapt_normalization``: its
``PreprocessingRecord`` is attached to the layer and composed into the privacy statement) or the user
asserted by name that it was adapted on public data (``assert_public_preprocessing``: the statement lists
the assertion under ``asserted_by_user``).

A record names the digest of the state it produced (``state_digest``) and is kept in the privacy record
store under it (``keep``): a layer holding that state by value (a loaded model, a clone given the weights)
is recognised as carrying the release (``recognised``), and composes it wherever it goes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib

import dp_accounting
import numpy as np

from tfdpbnn import _private_api


def state_digest(layer) -> str:
    """SHA-256 of a preprocessing layer's data-derived state: non-trainable variables, vocabulary, bins.

    A record or an assertion holds for the state it was made on; ``adapt`` called again afterwards changes
    the digest, and the layer is then treated as adapted on unknown data.
    """
    digest = hashlib.sha256()
    for variable in layer.non_trainable_variables:
        if not _private_api.is_variable(variable):  # e.g. a lookup layer's vocabulary handle (read below)
            continue
        digest.update(np.ascontiguousarray(np.asarray(variable.numpy())).tobytes())
    get_vocabulary = getattr(layer, "get_vocabulary", None)
    if callable(get_vocabulary):
        try:
            digest.update(repr(get_vocabulary()).encode())
        except (RuntimeError, ValueError, TypeError):
            digest.update(b"no-vocabulary")
    digest.update(repr(getattr(layer, "bin_boundaries", None)).encode())
    return digest.hexdigest()


@dataclasses.dataclass(frozen=True)
class PreprocessingRecord:
    """One DP release of preprocessing statistics: a Gaussian mechanism (Dwork & Roth 2014, Theorem A.1).

    Attributes:
      layer: the layer's name.
      mechanism: what was released (e.g. "normalization: noisy sums of z, z^2 and the count").
      noise_multiplier: noise standard deviation over the L2 sensitivity (the ``GaussianDpEvent``'s).
      l2_sensitivity: the L2 sensitivity of the released vector under ``neighboring``.
      noise_std: the standard deviation of the noise added to each released coordinate.
      epsilon: the epsilon the noise was calibrated to (at ``delta``, by ``accountant``).
      delta: the delta of that calibration.
      accountant: the accountant used for the calibration.
      neighboring: "add_or_remove" or "replace_one".
      details: JSON-safe facts about the release (bounds, number of features, post-processing applied;
        ``ledger_token``: the token it is written with to the per-record ledger, ``ledger_reservation``).
      state_digest: ``state_digest`` of the layer's state the release produced: the record vouches for that
        state wherever it goes (a saved and loaded model, a clone given its weights), and only for it.
    """

    layer: str
    mechanism: str
    noise_multiplier: float
    l2_sensitivity: float
    noise_std: float
    epsilon: float
    delta: float
    accountant: str
    neighboring: str
    details: dict = dataclasses.field(default_factory=dict)
    state_digest: str = ""

    def event(self) -> dp_accounting.DpEvent:
        """The release's ``DpEvent``: one Gaussian mechanism in units of its sensitivity."""
        return dp_accounting.GaussianDpEvent(self.noise_multiplier)

    @property
    def ledger_token(self) -> str:
        """The token of this release in the per-record ledger.

        ``details["ledger_token"]`` for a release written with its records (``labels``, ``record_ids``);
        else the token of its state (``unnamed_token``), under which the first DP run it feeds writes it.
        """
        return self.details.get("ledger_token") or self.unnamed_token

    @property
    def unnamed_token(self) -> str:
        """The ledger token of a release that named no records: one per released state, wherever it goes."""
        return hashlib.sha256(f"unnamed preprocessing {self.state_digest}".encode()).hexdigest()[:32]

    def to_config(self) -> dict:
        """A JSON-safe dict for the privacy statement (``from_config`` reads it back)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_config(cls, config) -> PreprocessingRecord:
        """The record ``to_config`` wrote (ValueError naming ``config`` when it is not one)."""
        names = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(config, dict) or not set(config) <= names or not {
                "layer", "mechanism", "noise_multiplier", "neighboring"} <= set(config):
            raise ValueError(f"config: not a PreprocessingRecord's to_config() dict, got {config!r:.200}")
        return cls(**{**config, "details": dict(config.get("details") or {})})

    def key(self) -> str:
        """The release's identity: its config as canonical JSON (equal for a record and its copies)."""
        import json

        return json.dumps(self.to_config(), sort_keys=True, default=str)


@contextlib.contextmanager
def ledger_reservation(record_keys, noise_multiplier: float, neighboring: str, description: str):
    """Reserve a DP preprocessing release for its records before its noise is drawn; commit it after.

    ``record_keys``: ``tfdpbnn.record.records.record_keys`` of the records the statistics are computed on,
    in the form training gives them (or their ids). The per-record ledger's budget
    (``RecordLedger.set_budget``) and naming check refuse the release before the block reads the data
    (``BudgetExceededError``, ``RecordNamingError``: nothing released or written). The release (one Gaussian
    mechanism of ``noise_multiplier``, ``PreprocessingRecord.event``) is committed when the block ends, in
    full whether or not the block finished: once its noise is drawn, an error that reports the noisy value
    releases it too. Yields the token written with it (``record_ledger.new_release_token``: the record's
    ``details["ledger_token"]``), or None when ``record_keys`` is None or the ledger is off (nothing written).
    """
    from tfdpbnn.record.record_ledger import default_ledger, new_release_token

    ledger = None if record_keys is None else default_ledger()
    if ledger is None:
        yield None
        return
    event = dp_accounting.GaussianDpEvent(noise_multiplier)
    token = new_release_token()
    reservation = ledger.reserve(record_keys, event, kind="preprocessing", neighboring=neighboring,
                                 description=description, token=token)
    try:
        yield token
    finally:
        reservation.commit(event)


#: The DP preprocessing releases this process made, in order: state digest -> its number (``keep``).
_MADE: dict[str, int] = {}


def releases_made() -> int:
    """How many DP preprocessing releases this process has made (``made_after`` tells the later ones)."""
    return len(_MADE)


def made_after(record: PreprocessingRecord, count: int) -> bool:
    """Whether this process made ``record``'s release after its first ``count`` (``releases_made``)."""
    number = _MADE.get(record.state_digest)
    return number is not None and number >= count


def keep(layer, record: PreprocessingRecord) -> None:
    """Attach ``record`` to ``layer`` and write it to the privacy record store under its state's digest.

    The store lets the release be found by the state's value (``recognised``) wherever the state goes
    without the layer object: a model saved and loaded, a clone given the weights, another process.
    """
    from tfdpbnn.record import attributes, store

    _MADE.setdefault(record.state_digest, len(_MADE))
    attributes.set_preprocessing_record(layer, record)
    held = store.default_store()
    if held is not None:
        held.record_preprocessing(record.state_digest, record.to_config())


def recognised(digest: str, held=(), look_in_store: bool = True) -> PreprocessingRecord | None:
    """The DP release that produced a preprocessing state of ``state_digest`` ``digest``, or None.

    Looked up among ``held`` (records an optimizer carries: a saved optimizer's config), then, with
    ``look_in_store``, in the privacy record store (``keep``).
    """
    for record in held:
        if record.state_digest == digest:
            return record
    if not look_in_store:
        return None
    from tfdpbnn.record import store

    kept = store.default_store()
    found = None if kept is None else kept.preprocessing_records(digest)
    return PreprocessingRecord.from_config(found[0]) if found else None


__all__ = ["PreprocessingRecord", "keep", "ledger_reservation", "recognised", "state_digest"]
