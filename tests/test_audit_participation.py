"""The sampling audit of the batches a real ``model.fit`` consumed (``ParticipationRecorder``)."""

import numpy as np
import pytest

import tfdpbnn
import tfdpbnn.audit
import tfdpbnn.audit.participation
from tests._small_runs import DELTA, LOSS, small_data, small_model

# Not in the fast tier (./scripts/test --fast): the sampling audit of real model.fit runs.
pytestmark = pytest.mark.slow

N, Q, STEPS, EPOCHS = 200, 0.1, 15, 2  # 600 participations expected; 900 at 1.5 q (sd about 23)


def _fit(recorder, seed=0):
    x, y = small_data(N)
    model = small_model()
    opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=int(Q * N), delta=DELTA,
                                 sampling="poisson")
    model.compile(optimizer=opt, loss=LOSS)
    data = recorder.poisson_batches(x, y, sample_rate=Q, steps_per_epoch=STEPS, seed=seed,
                                    debug_fixed_seed=True)
    model.fit(data, epochs=EPOCHS, callbacks=[recorder], verbose=0)
    return opt


def test_honest_fit_passes_and_the_recorded_batches_are_what_the_optimizer_counted():
    recorder = tfdpbnn.audit.ParticipationRecorder()
    opt = _fit(recorder)
    result = recorder.result()
    assert opt.steps == recorder.steps == EPOCHS * STEPS == result.steps
    # The recorded ids are the examples the optimizer's ledger counted (sum of batch sizes), each in range.
    assert result.participations == opt.ledger.phases[0].examples
    assert all(np.unique(b).size == b.size and b.max(initial=0) < N for b in recorder.batches)
    assert not result.flagged
    assert result.power_1_5x > 0.999


def test_rate_mutation_in_the_fits_pipeline_is_flagged():
    recorder = tfdpbnn.audit.ParticipationRecorder()
    with tfdpbnn.audit.inject_bug("sample-rate-1.5x"):
        x, y = small_data(N)
        data = recorder.poisson_batches(x, y, sample_rate=Q, steps_per_epoch=STEPS, seed=0,
                                        debug_fixed_seed=True)
    model = small_model()
    opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=int(Q * N), delta=DELTA,
                                 sampling="poisson")
    model.compile(optimizer=opt, loss=LOSS)
    model.fit(data, epochs=EPOCHS, callbacks=[recorder], verbose=0)
    result = recorder.result()
    assert result.flagged
    assert result.participations > 1.3 * result.expected_participations


def test_result_refuses_batches_the_fit_did_not_count():
    recorder = tfdpbnn.audit.ParticipationRecorder()
    with pytest.raises(ValueError, match="poisson_batches"):
        recorder.result()
    x, y = small_data(N)
    data = recorder.poisson_batches(x, y, sample_rate=Q, steps_per_epoch=3, seed=0, debug_fixed_seed=True)
    list(data)  # read outside any fit: 3 batches, 0 steps
    with pytest.raises(ValueError, match="optimizer steps"):
        recorder.result()


def test_fit_sampling_audit_refuses_mutations_a_fit_cannot_read():
    with pytest.raises(ValueError, match="broken"):
        tfdpbnn.audit.participation.fit_sampling_audit(broken="shard-overlap")
