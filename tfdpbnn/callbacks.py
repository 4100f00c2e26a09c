"""Keras callbacks for DP training: privacy spent in the logs, a budget stop, posterior snapshots."""

from __future__ import annotations

import collections
import numbers

import tensorflow as tf

from tfdpbnn import _adapters, _private_api
from tfdpbnn.record import attributes
from tfdpbnn.record import store as record_store

#: The key of the constant a DP step returns when it releases no training metric and Keras runs several steps
#: per train function (which needs some output); ``DPTrainingMonitor`` takes it out of the logs.
NO_RELEASED_METRICS = "dp_no_released_metrics"


def _dp_optimizer(model):
    optimizer = getattr(model, "optimizer", None)
    if attributes.run_record(optimizer) is None:  # only a tfdpbnn DP optimizer keeps a run record
        raise ValueError("model: PrivacyCallback needs a model compiled with a tfdpbnn DP optimizer, got "
                         f"{type(optimizer).__name__}")
    return optimizer


class PrivacyCallback(tf.keras.callbacks.Callback):
    """Write the epsilon spent so far into the Keras logs each epoch, and optionally stop at a budget.

    ``logs["epsilon"]`` is the optimizer's ``epsilon(delta, accountant)`` after the epoch (so ``History`` and
    ``TensorBoard`` show it: a DP ``fit`` moves this callback to the front of the list).
    ``all_sound=True`` adds ``epsilon_<name>`` for every accountant in
    ``tfdpbnn.privacy.sound_accountants()``.
    ``stop_at_epsilon``: before training, the largest number of steps whose epsilon stays within the budget
    is found once; training stops after that step, so no step exceeding the budget ever runs.

    Args:
      delta: the delta in (0, 1) epsilon is reported for.
      accountant: a ``tfdpbnn.privacy`` accountant name; default the optimizer's.
      all_sound: also log epsilon by each sound accountant.
      stop_at_epsilon: a budget > 0, or None.
    """

    def __init__(self, delta, accountant=None, all_sound=False, stop_at_epsilon=None):
        super().__init__()
        if isinstance(delta, bool) or not isinstance(delta, numbers.Real) or not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta!r}")
        if stop_at_epsilon is not None and (isinstance(stop_at_epsilon, bool) or not isinstance(
                stop_at_epsilon, numbers.Real) or not stop_at_epsilon > 0):
            raise ValueError(f"stop_at_epsilon must be a number > 0 or None, got {stop_at_epsilon!r}")
        if accountant is not None:
            from tfdpbnn import privacy

            if accountant not in privacy.available_accountants():
                raise ValueError(f"accountant must be one of {tuple(privacy.available_accountants())}, "
                                 f"got {accountant!r}")
        self.delta = float(delta)
        self.accountant = accountant
        self.all_sound = bool(all_sound)
        self.stop_at_epsilon = stop_at_epsilon
        self.max_steps = None
        self.stopped_at_step = None
        self._names_checked = False

    def on_train_begin(self, logs=None):
        """With ``stop_at_epsilon``: the most steps within it (``optimizer.steps_within``); raise if spent."""
        optimizer = _dp_optimizer(self.model)
        if self.stop_at_epsilon is not None:
            left = optimizer.steps_within(self.stop_at_epsilon, self.delta, self.accountant)
            if left <= 0:
                raise ValueError(
                    f"stop_at_epsilon: the budget {self.stop_at_epsilon} is spent ({optimizer.steps} steps "
                    "taken); one more step would exceed it")
            self.max_steps = optimizer.steps + left

    def on_train_batch_end(self, batch, logs=None):
        """Stop training before the step (or ``steps_per_execution`` block) that would pass the budget."""
        if self.max_steps is not None:
            steps = _dp_optimizer(self.model).steps  # DP steps (code may set optimizer.iterations)
            if steps + _private_api.steps_per_execution(self.model) > self.max_steps:
                self.model.stop_training = True
                self.stopped_at_step = steps

    def on_epoch_end(self, epoch, logs=None):
        """Write ``epsilon`` to ``logs`` (with ``all_sound`` also ``epsilon_<name>`` per sound accountant)."""
        if logs is None:
            return
        optimizer = _dp_optimizer(self.model)
        logs["epsilon"] = optimizer.epsilon(delta=self.delta, accountant=self.accountant)
        if self.all_sound:
            from tfdpbnn import privacy

            for name in privacy.sound_accountants():
                logs[f"epsilon_{name}"] = optimizer.epsilon(delta=self.delta, accountant=name)


class DPTrainingMonitor(tf.keras.callbacks.Callback):
    """What a DP ``fit`` runs first, every time: the budget stop, the Poisson test, epsilon in the logs.

    A DP ``model.fit`` puts one at the front of its callbacks (users need not add it):

    - Budget (optimizer built from ``epsilon``/``delta``, or ``target_epsilon``): training stops before the
      step (or the ``steps_per_execution`` block) that would exceed it; a ``fit`` with nothing left, or
      with less left than one ``steps_per_execution`` block, raises.
    - The noise multiplier: one changed during ``fit`` (a callback writing the optimizer's variables), found
      at the epoch's end or the end of ``fit``, stops training with ``ValueError``; lowered, the statement's
      ``guarantee`` is false (``_noise_check``). Variables the model reads but does not own (a global
      ``tf.Variable`` in a ``Lambda``) are compared at the same times (``_foreign_check``), and before every
      batch by ``StateWatch``.
    - Poisson sampling: the realized batch sizes are tested against Binomial(n, q)
      (``tfdpbnn.privacy.sampling_test``; whole-run false-alarm rate ``false_alarm_rate``) after 8, 16, 32,
      ... steps and at every epoch end. On rejection the steps taken are re-accounted without
      amplification (every step as if every example took part) and training stops with ``ValueError``
      saying what was observed.
    - Passes over the data (``check_passes=True``: a dataset iterated whole each epoch): every epoch must
      process exactly ``num_examples`` examples, or fewer by less than the optimizer's ``batch_size`` (a
      last partial batch dropped: ``batch(batch_size, drop_remainder=True)``, counted as a whole pass);
      otherwise the steps taken are re-accounted as one participation each and training stops with
      ``ValueError`` naming both numbers.
    - The privacy record store (``tfdpbnn.record.store``): a snapshot of the run at every epoch end and
      a final one at the end of training (a ``fit`` with no callback but tfdpbnn's writes its last epoch's
      snapshot as the final one: nothing can read the weights in between).
    - ``logs["epsilon"]`` (with the optimizer's delta) at every epoch end, for ``History`` and
      ``TensorBoard`` (with an accountant other than "rdp": ``logs["epsilon_rdp"]`` at every epoch end and
      ``logs["epsilon"]`` at the last; ``on_epoch_end``).
    - A restore by another callback's ``on_train_begin`` (``BackupAndRestore``) is counted at the first
      epoch's start (``RunRecord.check_rewind``). ``others_may_restore=False`` says that the ``fit`` has no
      callback but tfdpbnn's (which restore nothing): the check is skipped (``fit`` passes it so when the
      caller gave no callback).
    - One DP update per step: at every epoch's end, the DP updates the epoch made (the optimizer's count
      of DP writes) are compared with the steps ``fit`` ran; more updates than steps (a ``train_step``
      that updates again inside a loop or function of its own, which the trace's checks did not see) stop
      training with ``ValueError``, and the statement's ``guarantee`` is false: each extra update's batch
      was not drawn by the sampler the ledger accounts (``_update_check``).
    - ``batch_savers``: the callbacks that save the weights every so many batches (``ModelCheckpoint`` or
      ``BackupAndRestore`` with an integer ``save_freq``; ``fit`` passes them). At a batch end where one
      of them will save (read from its own counters before it runs; every batch end where they cannot be
      read), a snapshot is taken first, so weights saved in the middle of a pass are known to the record
      wherever they are loaded (a new model, another process) and carry the steps that made them.
    """

    def __init__(self, false_alarm_rate=None, check_passes=False, others_may_restore=True, batch_savers=()):
        super().__init__()
        self.check_passes = bool(check_passes)
        self.others_may_restore = bool(others_may_restore)
        self.batch_savers = list(batch_savers)
        for saver in self.batch_savers:
            if not isinstance(saver, tf.keras.callbacks.Callback):
                raise ValueError(f"batch_savers must hold Keras callbacks, got {saver!r}")
        self._epoch_start_examples = None
        self._epoch_start_writes = None  # the optimizer's count of DP writes at the epoch's start
        self._epoch_steps = 0  # the steps fit ran in this epoch (the last batch end's index + 1)
        from tfdpbnn.privacy import sampling_test

        self.false_alarm_rate = sampling_test.DEFAULT_FALSE_ALARM_RATE if false_alarm_rate is None \
            else float(false_alarm_rate)
        if not 0 < self.false_alarm_rate < 1:
            raise ValueError(f"false_alarm_rate must be in (0, 1), got {false_alarm_rate!r}")
        self.max_steps = None
        self.stopped_at_step = None
        self._names_checked = False
        self._snapshot_due = False
        self._eager_steps = False  # the model runs its steps eagerly (on_train_begin)

    def on_train_begin(self, logs=None):
        """Start the step counts and set the budget stop; raise if the optimizer's budget is already spent."""
        optimizer = _dp_optimizer(self.model)
        attributes.ledger_state(optimizer).drop_kept()  # an earlier fit's epoch end: not this fit's reads
        attributes.ledger_state(optimizer).guard_disarm()  # armed at the first epoch's start, after restores
        with attributes.ledger_state(optimizer).reading_once():  # no step, no restore in this block
            self._train_begin(optimizer)

    def _train_begin(self, optimizer):
        # Steps are counted here in Python, so a batch end costs no read of a training variable: the open
        # phase's, for the Poisson test's schedule, when the phase is a Poisson one (the test tests nothing
        # else; the phase changes only at a run's start or a restore, which runs this again), and the DP
        # steps, for the budget stop (when there is a budget).
        state = attributes.ledger_state(optimizer)
        description = state.open_description()
        poisson = description is not None and description["kind"] == "poisson"
        self._open_steps = state.open_steps() if poisson else None
        self._per_call = _private_api.steps_per_execution(self.model)
        self._eager_steps = bool(getattr(self.model, "run_eagerly", False))
        left = optimizer.budget_steps_left()
        self._steps = 0 if left is None else optimizer.steps
        self.max_steps = None
        if left is not None:
            if left <= 0:
                raise ValueError(
                    f"epsilon: the budget epsilon={optimizer.target_epsilon:g} (delta={optimizer.delta:g}) "
                    f"is spent: epsilon is {optimizer.epsilon():.4g} after {optimizer.ledger.steps} steps "
                    "and one more step would exceed it. Build the optimizer with "
                    "allow_exceeding_budget=True to go on (the privacy statement then reports the larger "
                    "epsilon).")
            if left < self._per_call:
                raise ValueError(
                    f"steps_per_execution: the model runs {self._per_call} steps per execution, and the "
                    f"budget epsilon={optimizer.target_epsilon:g} (delta={optimizer.delta:g}) allows "
                    f"{left} more; training can stop only between executions, so the first one would "
                    f"exceed the budget. Compile with steps_per_execution <= {left}, or build the optimizer "
                    "with allow_exceeding_budget=True.")
            self.max_steps = self._steps + left  # read above, in this block

    def _foreign_check(self, when: str) -> None:
        """Refuse a change of a variable the model reads but does not own (a global one in a ``Lambda``).

        The model's last check listed them (``tfdpbnn.optimizers.outside_reads``, trainable or not) and kept
        their values; the DP step does not train them, so their values are constants of the model during
        ``fit`` (set before it, they are trusted as constants you give a layer, and the model was checked
        with them). Changed during ``fit`` (a callback setting one from the data, or one that makes the model
        mix examples), they carry what no epsilon covers: set back, named, and the statement's ``guarantee``
        is false; one asserted public (``optimizer.assert_public_variable``) is checked with its new value
        instead. Also before every batch (``StateWatch``, after every callback).
        """
        self.model.optimizer._dp_outside_reads_before_step(self.model, when)

    def _noise_check(self, optimizer):
        """Refuse a noise multiplier changed during ``fit`` (a callback writing ``optimizer.variables``).

        The open phase of the privacy ledger describes its steps with the noise multiplier it was opened
        with; steps run with another one are not the steps it accounts. A lower one makes the printed
        epsilon too small: the write is then named in the statement (``guarantee`` false). A new ``fit``
        opens a phase with the optimizer's noise multiplier of that time.
        """
        sigma = optimizer.noise_multiplier
        phase = attributes.ledger_state(optimizer).changed_noise(sigma)
        if phase is None:
            return
        watch = getattr(optimizer, "_dp_write_watch", None)
        if sigma < phase and watch is not None:
            watch.taint(["dp_noise_multiplier"])
        self.model.stop_training = True
        raise ValueError(
            f"noise_multiplier: the optimizer's noise multiplier was changed during fit, from "
            f"{phase:g} (the privacy ledger's open phase) to {sigma:g} (a callback "
            "or code writing the optimizer's variables); the steps that ran with it are not the steps the "
            "ledger accounts" + (", so the privacy statement now holds no guarantee" if sigma < phase else "")
            + ". Change the noise between fits: each fit opens a phase with the optimizer's noise "
            "multiplier.")

    def _poisson_check(self, optimizer):
        from tfdpbnn.privacy import sampling_test

        state = attributes.ledger_state(optimizer)
        description = state.open_description()
        if description is None or description["kind"] != "poisson" or description["source"] == "fixed_seed":
            return
        steps, total, squared = state.open_counters()
        if steps < 1 or not description["sample_rate"] or description["sample_rate"] >= 1:
            return
        result = sampling_test.poisson_batch_test(description["num_examples"], description["sample_rate"],
                                                  steps, total, squared, self.false_alarm_rate)
        if result.rejected:
            state.close_open_phase(source="failed_poisson_test")
            self.model.stop_training = True
            raise ValueError(
                f"x: the batches are clearly not Poisson-sampled at rate q={description['sample_rate']:g} "
                f"from n={description['num_examples']} examples ({result.describe()}). The {steps} steps "
                "taken are now accounted without subsampling amplification; feed "
                "tfdpbnn.data.poisson_batches output (or fix the asserted sampling).")

    def _withhold_training_metrics(self, logs):
        """Take the training-batch metrics the optimizer does not release out of ``logs`` (in place).

        This callback runs first, and Keras hands every callback the same logs dict, so ``History``, the
        progress bar, ``TensorBoard`` and the user's callbacks do not see ``loss`` and the model's metrics
        (``model.metrics``: compiled losses and metrics, ``add_metric``) unless they are named in
        ``release_training_metrics``. Epsilon, the validation metrics (``val_*``) and the optimizer's own
        logs (e.g. DPVD's ``zeta``, a function of its settings and weights) stay.
        """
        if not logs:
            return
        logs.pop(NO_RELEASED_METRICS, None)
        if not logs:  # nothing to withhold: the optimizer is not read (a batch end's usual case)
            return
        released = self.model.optimizer.release_training_metrics
        if released is True:
            return
        if released and not self._names_checked:
            self._names_checked = True
            missing = sorted(set(released) - set(logs))
            if missing:
                raise ValueError(f"release_training_metrics: {missing} are not training metrics of this "
                                 f"model; its logs hold {sorted(logs)}")
        names = {m.name for m in _private_api.metric_objects(self.model)}
        withheld = ({"loss"} | names) - set(released or ())
        for key in list(logs):
            if key in withheld:
                del logs[key]

    def on_train_batch_begin(self, batch, logs=None):
        """A step run eagerly (``run_eagerly``) makes one DP write per step of the batch starting now."""
        if self._eager_steps:
            self.model.optimizer._dp_new_eager_steps(self._per_call)

    def on_train_batch_end(self, batch, logs=None):
        """Count steps; run the Poisson test after 8, 16, 32, ... steps; stop before passing the budget.

        Training-batch metrics not released (``release_training_metrics``) are taken out of the logs. The
        run's reservation, whose wait for the disk ran beside the first steps, is on the disk before any
        later callback can save what they trained (``record_store.wait_durable``).
        """
        record_store.wait_durable()
        self._epoch_steps = batch + 1
        if self.batch_savers:  # a snapshot before a saver that saves at this batch end
            saves = _adapters.current().saves_after_batch
            if any(saves(c, batch) for c in self.batch_savers):
                attributes.run_record(self.model.optimizer).snapshot(self.model)
        self._withhold_training_metrics(logs)
        if self._per_call > 1:  # only the steps ran since the last check: what they changed, read unchecked
            self.model.optimizer._dp_outside_reads_after_execution(self.model, self._per_call)
        self._steps += self._per_call
        if self._open_steps is not None:  # a Poisson phase (_train_begin)
            self._open_steps += self._per_call
            if self._open_steps >= 8 and self._open_steps & (self._open_steps - 1) == 0:  # 8, 16, 32, ...
                self._poisson_check(self.model.optimizer)
        if self.max_steps is not None and self._steps + self._per_call > self.max_steps:
            self.model.stop_training = True
            self.stopped_at_step = self._steps

    def on_epoch_begin(self, epoch, logs=None):
        """Count a restore that rewound the ledger (first epoch); remember the open phase's examples.

        A callback's ``on_train_begin`` (``BackupAndRestore`` resuming after a crash) may have restored the
        optimizer to an earlier step: the steps it took off are counted again
        (``RunRecord.account_rewind``) and the budget stop restarts from the restored step.
        """
        optimizer = self.model.optimizer
        state = attributes.ledger_state(optimizer)
        # The privacy bookkeeping, written since the last epoch's end by code other than tfdpbnn's (armed
        # from the first epoch's start: a restore in on_train_begin is counted by check_rewind below). Only
        # callbacks run between an epoch's end (compared there) and the next one's start: with none but
        # tfdpbnn's, nothing else could have written it.
        if self.others_may_restore:
            optimizer._dp_refuse_bookkeeping_written(self.model, f"found at the start of epoch {epoch}")
        state.drop_kept()  # the last epoch end's reads: steps run after this epoch's start
        if self._snapshot_due:  # the epoch before was taken for the last (see _epoch_end): its snapshot now
            self._snapshot_due = False
            attributes.run_record(optimizer).snapshot(self.model)
        with state.reading_once():  # a restore ran before (on_train_begin); nothing here takes a step
            if attributes.run_record(optimizer).check_rewind(restore_possible=self.others_may_restore):
                self.on_train_begin()
        if self.check_passes:  # only the pass check reads it
            self._epoch_start_examples = float(_private_api.read_numpy(state.open_examples))
        self._epoch_start_writes = float(_private_api.read_numpy(optimizer._dp_write_count))
        self._epoch_steps = 0
        if not state.guard_armed:  # armed, its copies hold what the comparison above found: nothing to copy
            # Compared from now on at every epoch's end (and the next one's start) and the end of fit. Its
            # copies hold the variables as the run's start compared them and tfdpbnn wrote them since; with
            # no callback but tfdpbnn's, nothing else ran in between: nothing to copy.
            state.guard_arm(sync=self.others_may_restore)

    def _update_check(self, optimizer):
        """Refuse an epoch that made more DP updates than ``fit`` ran steps (see the class).

        ``fit``'s step indices count its steps (a resumed epoch starts at the step it resumed at, which counts
        the skipped ones: never more updates than that); the optimizer's count of DP writes counts each DP
        update once, on every replica together.
        """
        if self._epoch_start_writes is None:
            return
        updates = float(_private_api.read_numpy(optimizer._dp_write_count)) - self._epoch_start_writes
        if updates <= self._epoch_steps + 0.5:
            return
        updates = int(round(updates))
        reason = f"the DP updates ({updates} in {self._epoch_steps} steps of fit: more than one per step)"
        optimizer._dp_write_watch.taint([reason])
        attributes.run_record(optimizer).mark_unbounded_batches(reason)
        self.model.stop_training = True
        raise ValueError(
            f"model: this epoch made {updates} DP updates in {self._epoch_steps} steps of fit: its "
            "train_step updates more than once per step (dp_train_step, minimize or the mechanism in a loop "
            "or function of its own). Each step's batch is the one fit's sampler drew, and the privacy "
            "ledger counts every update's examples as drawn so; the extra updates' batches were not, so no "
            "epsilon covers them and the privacy statement now holds no guarantee. Make one DP update per "
            "step, on the step's batch.")

    def _pass_check(self, optimizer):
        if not self.check_passes or self._epoch_start_examples is None:
            return
        state = attributes.ledger_state(optimizer)
        description = state.open_description()
        if description is None:
            return
        seen = int(round(float(_private_api.read_numpy(state.open_examples)) - self._epoch_start_examples))
        n = description["num_examples"]
        if seen == n:
            return
        if 0 < n - seen < (description.get("batch_size") or 0):
            # The pass's last partial batch dropped (batch(B, drop_remainder=True), with the optimizer's B):
            # each record at most once in it, as asserted, so one participation of each at most. Counted as
            # a whole pass: the next epoch's iteration is another pass, never pooled with this one.
            state.finish_partial_pass()
            return
        consequence = ("; the steps taken are now accounted as one participation each. Assert the dataset's "
                       "real size (a pass may hold fewer examples only by less than the optimizer's "
                       f"batch_size={description.get('batch_size')}: its last partial batch dropped).")
        if seen > n:
            # More examples than records: a record was drawn again within the pass, maybe within one batch,
            # whose clipped sum it then moves by more than the clip bound.
            reason = (f"the asserted pipeline's batches (one pass held {seen} examples, num_examples={n} was "
                      "asserted: a record may be in one batch more than once)")
            optimizer._dp_write_watch.taint([reason])
            attributes.run_record(optimizer).mark_unbounded_batches(reason)
            consequence = (": a record may have been in one batch more than once, which moves its noised sum "
                           "by more than the clip bound, so no epsilon covers these steps and the privacy "
                           "statement now holds no guarantee (the ledger records a non-private release for "
                           "the run's records). Assert the dataset's real size, with each record once per "
                           "pass.")
        state.close_open_phase(source="failed_pass_check")
        self.model.stop_training = True
        raise ValueError(f"num_examples: one pass over the dataset held {seen} examples, but it was asserted "
                         f"to be a pass over num_examples={n}{consequence}")

    def on_epoch_end(self, epoch, logs=None):
        """Run the Poisson test and the pass check; write epsilon to ``logs`` when the delta is known.

        With the "rdp" accountant, ``logs["epsilon"]`` at every epoch end (its per-step curves are cached, so
        the cost does not grow with the steps). With another accountant (PLD costs seconds at thousands of
        steps), ``logs["epsilon_rdp"]`` (RDP's bound, also an upper bound) at every epoch end and
        ``logs["epsilon"]`` by the optimizer's accountant at the last planned epoch or when training stops.
        """
        record_store.wait_durable()
        self._withhold_training_metrics(logs)
        optimizer = _dp_optimizer(self.model)
        optimizer._dp_refuse_bookkeeping_written(self.model, f"found at the end of epoch {epoch}")
        # The checks, snapshot and epsilon: no step. With no callback but tfdpbnn's (which take no step and
        # restore nothing), nothing writes the ledger between here and on_train_end, or the next epoch's
        # start (which drops them): the reads are kept for on_train_end's snapshot.
        with attributes.ledger_state(optimizer).reading_once(keep=not self.others_may_restore):
            self._epoch_end(optimizer, epoch, logs)

    def _epoch_end(self, optimizer, epoch, logs):
        self._noise_check(optimizer)
        self._update_check(optimizer)
        self._foreign_check(f"found at the end of epoch {epoch}")
        self._poisson_check(optimizer)
        self._pass_check(optimizer)
        planned = (self.params or {}).get("epochs")
        if not self.others_may_restore and (self.model.stop_training or (
                planned is not None and epoch + 1 >= planned)):
            # The last epoch of a fit that runs no callback but tfdpbnn's: nothing can read or save the
            # weights before on_train_end, whose final snapshot holds the same weights and ledger; written
            # there, in one transaction (or at the next epoch's start, should one begin).
            self._snapshot_due = True
        else:
            attributes.run_record(optimizer).snapshot(self.model)
        if logs is None or optimizer.delta is None:
            return
        if optimizer.accountant == "rdp":
            logs["epsilon"] = optimizer.epsilon()
            return
        import dp_accounting

        try:
            logs["epsilon_rdp"] = optimizer.epsilon(accountant="rdp")
        except dp_accounting.UnsupportedEventError:  # e.g. Poisson under replace-one: only PLD bounds it
            logs["epsilon"] = optimizer.epsilon()
            return
        if self.model.stop_training or planned is None or epoch + 1 >= planned:
            logs["epsilon"] = optimizer.epsilon()


    def on_train_end(self, logs=None):
        """Write the run's final snapshot to the privacy record store."""
        record_store.wait_durable()
        self._withhold_training_metrics(logs)
        optimizer = _dp_optimizer(self.model)
        optimizer._dp_refuse_bookkeeping_written(self.model, "found at the end of fit")
        self._snapshot_due = False  # the last epoch's end: the same weights and ledger as this final snapshot
        # The snapshot and the checks: no step. It resumes from the last epoch end's reads when that block
        # kept them (no callback but tfdpbnn's, no epoch since; on_epoch_end).
        with attributes.ledger_state(optimizer).reading_once(resume=not self.others_may_restore):
            attributes.run_record(optimizer).snapshot(self.model, final=True)
            self._noise_check(optimizer)
        self._foreign_check("found at the end of fit")


class PosteriorSampler(tf.keras.callbacks.Callback):
    """Keep thinned DP-SGLD weight snapshots after burn-in: posterior samples (Zhang et al. 2022, sec. 3.1).

    After step ``burn_in``, every ``thinning``-th step's ``model.get_weights()`` is kept; at most the last
    ``max_samples`` are. ``samples`` is the list ``tfdpbnn.uncertainty.mc_predict`` accepts as weight
    snapshots. Snapshots are post-processing of the DP iterates: they cost no privacy.
    """

    def __init__(self, burn_in=0, thinning=1, max_samples=100):
        super().__init__()
        if isinstance(burn_in, bool) or not isinstance(burn_in, numbers.Integral) or burn_in < 0:
            raise ValueError(f"burn_in must be an integer >= 0, got {burn_in!r}")
        if isinstance(thinning, bool) or not isinstance(thinning, numbers.Integral) or thinning < 1:
            raise ValueError(f"thinning must be an integer >= 1, got {thinning!r}")
        if isinstance(max_samples, bool) or not isinstance(max_samples, numbers.Integral) or max_samples < 1:
            raise ValueError(f"max_samples must be an integer >= 1, got {max_samples!r}")
        self.burn_in = int(burn_in)
        self.thinning = int(thinning)
        self.max_samples = int(max_samples)
        self._samples = collections.deque(maxlen=self.max_samples)
        self.sampled_steps = collections.deque(maxlen=self.max_samples)

    @property
    def samples(self):
        """The kept snapshots, oldest first (each a ``model.get_weights()`` list)."""
        return list(self._samples)

    def on_train_batch_end(self, batch, logs=None):
        """Keep ``model.get_weights()`` after every ``thinning``-th step past ``burn_in``."""
        step = int(_private_api.read_numpy(self.model.optimizer.iterations))
        if step > self.burn_in and (step - self.burn_in) % self.thinning == 0:
            self._samples.append(self.model.get_weights())
            self.sampled_steps.append(step)
