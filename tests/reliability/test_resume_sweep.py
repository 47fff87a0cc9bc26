"""Resume gives the same result, whatever the moment of the interruption: a sweep over every step of a short run.

linvit_nano on scikit-learn's digits at 16x16, 3 epochs x 3 steps, EMA on, every step logged and flushed to
``metrics.csv``, test and export at the end. Two validations: in 3 batches of 4 (a signal can land inside it), and
in one batch (the default batch size). At every moment (before each of the 9 training steps, inside each
validation, after training):

- SIGTERM: the run saves and exits, the same command resumes it; also at the epoch boundary (when a validation has
  ended, at the end of the training epoch, while the validation's checkpoint is saved), with the default sanity
  check, which runs again when such a run resumes;
- SIGKILL: the run directory as a kill at that moment leaves it (a copy taken then by the uninterrupted run, resumed
  in the same place), which the same command resumes;

and the resumed run must leave what the uninterrupted run leaves: ``last.ckpt`` and ``best.ckpt`` bit for bit
(weights, EMA, optimizer, loops, callback states), the exported weights, ``metrics.csv`` row for row, and the final
metrics. The runs are in-process (a real signal to this process; Lightning turns SIGTERM into ``SIGTERMException``,
a ``SystemExit``); ``test_crash_resume.py`` has the same with real subprocesses for a few moments.
"""

from __future__ import annotations

import pytest
from _crash_helpers import (
    SignalAtStep,
    SignalAtTrainEpochEnd,
    SignalAtValidationEnd,
    SignalDuringEpochSave,
    SignalDuringValidation,
    SnapshotRunDir,
)
from _run_state import assert_same_run, run_state
from train_helpers import compose

from linvit.train.runs.run import train

STEPS_PER_EPOCH, EPOCHS = 3, 3
SHORT_RUN = [
    "model.model_name=linvit_nano",
    "data.img_size=16",
    "data.batch_size=16",
    "data.num_workers=0",
    f"trainer.max_epochs={EPOCHS}",
    f"+trainer.limit_train_batches={STEPS_PER_EPOCH}",
    "+trainer.limit_test_batches=2",
    "trainer.num_sanity_val_steps=0",
    "trainer.accelerator=cpu",
    "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
    "trainer.log_every_n_steps=1",
    "callbacks.model_summary=null",
    "model.ema.enabled=true",
    "+logger.csv.flush_logs_every_n_steps=1",  # rows reach the file between checkpoints, as in a long run
]
VALIDATIONS = {
    "multi_batch_val": ["data.eval_batch_size=4", "+trainer.limit_val_batches=3"],
    "one_batch_val": ["+trainer.limit_val_batches=1"],
    # the default sanity check, which runs again when a run resumes from the end of an epoch (and resets the
    # trainer's metrics): the epoch-boundary moments below
    "sanity_checked_val": ["data.eval_batch_size=4", "+trainer.limit_val_batches=3", "trainer.num_sanity_val_steps=1"],
}
STEPS = [f"step{k}" for k in range(STEPS_PER_EPOCH * EPOCHS)]
IN_VALIDATION = [f"val{e}" for e in range(EPOCHS)]


# the epoch boundary: when epoch e's validation has ended (after its checkpoints), at the end of the training epoch,
# and while the checkpoint of that validation is being saved
AT_EPOCH_END = [f"{where}{e}" for e in range(EPOCHS) for where in ("val_end", "epoch_end", "epoch_save")]
_BOUNDARY_SIGNALS = {
    "val_end": SignalAtValidationEnd,
    "epoch_end": SignalAtTrainEpochEnd,
    "epoch_save": SignalDuringEpochSave,
}


def _signal_at(moment: str, signal_name: str):
    if moment.startswith("step"):
        return SignalAtStep(int(moment[4:]), signal_name)
    for where, signal_class in _BOUNDARY_SIGNALS.items():
        if moment.startswith(where):
            return signal_class(int(moment[len(where) :]), signal_name)
    return SignalDuringValidation(int(moment[3:]), signal_name)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return tmp_path_factory.mktemp("sweep")


@pytest.fixture(scope="module")
def references(runs):
    """Per validation: the uninterrupted run's state, computed once."""
    cache = {}

    def reference(validation: str) -> dict:
        if validation not in cache:
            # it runs in work/ and copies its directory at every moment (what SIGKILL would leave there), and each
            # copy is resumed in work/ again: the checkpoint callback keeps its records (best_k_models,
            # last_model_path) only for the directory it wrote, as a real killed run is resumed where it ran
            work = runs / validation / "work"
            overrides = SHORT_RUN + VALIDATIONS[validation]
            train(compose(overrides, work), callbacks=[SnapshotRunDir(work, runs / validation / "killed")])
            cache[validation] = run_state(work)
            work.rename(runs / validation / "reference")
        return cache[validation]

    return reference


@pytest.mark.slow
@pytest.mark.parametrize(
    "validation, moment",
    [("multi_batch_val", moment) for moment in STEPS + IN_VALIDATION]
    + [("one_batch_val", m) for m in STEPS]
    # the resumed run's checkpoints lacked train/loss_epoch in ResumeLoggedMetrics' state (the sanity check reset it)
    + [("sanity_checked_val", m) for m in AT_EPOCH_END],
)
def test_sigterm_then_resume_matches_the_uninterrupted_run(runs, references, validation, moment):
    reference = references(validation)
    run_dir = runs / validation / f"sigterm_{moment}"
    overrides = SHORT_RUN + VALIDATIONS[validation]
    with pytest.raises(SystemExit) as stopped:
        train(compose(overrides, run_dir), callbacks=[_signal_at(moment, "SIGTERM")])
    assert stopped.value.code in (None, 0), "SIGTERM must end the run cleanly"
    train(compose(overrides, run_dir))
    assert_same_run(reference, run_state(run_dir), f"SIGTERM at {moment}, resumed")


@pytest.mark.slow
@pytest.mark.parametrize("moment", STEPS + IN_VALIDATION + ["end"])
def test_sigkill_then_resume_matches_the_uninterrupted_run(runs, references, moment):
    reference = references("multi_batch_val")
    killed, work = runs / "multi_batch_val" / "killed" / moment, runs / "multi_batch_val" / "work"
    assert killed.is_dir(), f"the reference run took no copy at {moment}"
    killed.rename(work)
    try:
        train(compose(SHORT_RUN + VALIDATIONS["multi_batch_val"], work))
        state = run_state(work)
    finally:
        work.rename(killed)
    assert_same_run(reference, state, f"SIGKILL at {moment}, resumed")
