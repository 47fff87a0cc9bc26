"""Killed runs lose nothing: ``train.py`` as a subprocess, killed mid-epoch (SIGKILL) or pre-empted (SIGTERM), then
rerun with the same ``run_name`` (automatic resume); the result must equal that of a run never interrupted.

linvit_nano on scikit-learn's digits at 16x16, 3 epochs x 4 steps, on the CPU; each subprocess takes ~8 s of CPU
(most of it importing torch/Lightning/timm).
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
HELPERS = Path(__file__).resolve().parent
STEPS_PER_EPOCH, EPOCHS = 4, 3
TOTAL_STEPS = STEPS_PER_EPOCH * EPOCHS
TINY_RUN = [
    "model.model_name=linvit_nano",
    "data.img_size=16",
    "data.batch_size=16",
    f"trainer.max_epochs={EPOCHS}",
    f"+trainer.limit_train_batches={STEPS_PER_EPOCH}",
    "+trainer.limit_val_batches=1",
    "trainer.num_sanity_val_steps=0",
    "trainer.enable_progress_bar=false",
    "test=false",
    "export.enabled=false",
    "logger=none",
    "callbacks.learning_curves=null",
    "callbacks.model_summary=null",
    # the fault-tolerance callbacks (configs/callbacks/fault_tolerance.yaml), whether or not the default includes them
    "++callbacks.atomic_checkpointing._target_=linvit.train.modules.fault_tolerance.AtomicCheckpointing",
    "++callbacks.non_finite_loss._target_=linvit.train.modules.fault_tolerance.NonFiniteLossGuard",
]


def _train(
    log_dir: Path, run_name: str, *extra: str, check: bool = True, new_session: bool = False
) -> subprocess.CompletedProcess:
    """Run train.py in a subprocess; it records its final step count and weight digest in <run_name>.json.

    ``new_session``: in its own session and process group (for a test that signals the whole group).
    """
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HELPERS), env.get("PYTHONPATH")]))
    command = [
        sys.executable,
        str(ROOT / "train.py"),
        f"paths.log_dir={log_dir}",
        f"run_name={run_name}",
        *TINY_RUN,
        "+callbacks.final_state._target_=_crash_helpers.RecordFinalState",
        f"+callbacks.final_state.path={log_dir / (run_name + '.json')}",
        *extra,
    ]
    result = subprocess.run(
        command, cwd=log_dir, env=env, capture_output=True, text=True, timeout=600, start_new_session=new_session
    )
    if check and result.returncode != 0:
        raise AssertionError(f"train.py exited with {result.returncode}:\n{result.stderr[-4000:]}")
    return result


def _run_dir(log_dir: Path, run_name: str) -> Path:
    return log_dir / "digits_linvit_nano" / run_name


def _outcome(log_dir: Path, run_name: str) -> dict:
    """The final step count, weight digest and metrics of a finished run (timings dropped)."""
    state = json.loads((log_dir / f"{run_name}.json").read_text())
    metrics = json.loads((_run_dir(log_dir, run_name) / "metrics.json").read_text())
    state["metrics"] = {key: value for key, value in metrics.items() if not key.startswith("time/")}
    return state


def _ckpt_step(path: Path) -> int:
    return int(torch.load(path, map_location="cpu", weights_only=True)["global_step"])


def _signal_at(step: int, name: str) -> list[str]:
    return [
        "+callbacks.crash._target_=_crash_helpers.SignalAtStep",
        f"+callbacks.crash.step={step}",
        f"+callbacks.crash.signal_name={name}",
    ]


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="module")
def reference(log_dir) -> dict:
    """The uninterrupted run."""
    _train(log_dir, "reference")
    outcome = _outcome(log_dir, "reference")
    assert outcome["global_step"] == TOTAL_STEPS
    return outcome


# slow: ~25 s, and the slow tier's resume sweep kills train() at every step and validation moment
@pytest.mark.slow
def test_sigkill_mid_epoch_then_resume_matches_uninterrupted_run(log_dir, reference):
    kill_step = STEPS_PER_EPOCH + STEPS_PER_EPOCH // 2  # in the middle of the second epoch
    killed = _train(log_dir, "killed", *_signal_at(kill_step, "SIGKILL"), check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    last = _run_dir(log_dir, "killed") / "checkpoints" / "last.ckpt"
    assert last.is_file(), "the first epoch's checkpoint is missing after the kill"
    assert _ckpt_step(last) == STEPS_PER_EPOCH  # loads: intact; from the end of the first epoch
    assert not list(last.parent.glob("*.linvit-tmp")), "a temporary checkpoint file was left behind"

    _train(log_dir, "killed")  # same run_name: resumes from last.ckpt
    assert _outcome(log_dir, "killed") == reference


@pytest.fixture(scope="module")
def preempted(log_dir) -> Path:
    """A run sent SIGTERM during the batch after STEPS_PER_EPOCH + 1 steps (mid-epoch); returns its run name."""
    result = _train(log_dir, "preempted", *_signal_at(STEPS_PER_EPOCH + 1, "SIGTERM"), check=False)
    assert result.returncode == 0, f"SIGTERM must end the run cleanly:\n{result.stderr[-2000:]}"
    return "preempted"


def test_sigterm_saves_a_checkpoint_before_exiting(log_dir, preempted):
    last = _run_dir(log_dir, preempted) / "checkpoints" / "last.ckpt"
    # the batch in flight finishes, then the save: one step more than when the signal came
    assert _ckpt_step(last) == STEPS_PER_EPOCH + 2
    assert not list(last.parent.glob("*.linvit-tmp")), "a temporary checkpoint file was left behind"
    assert not (log_dir / f"{preempted}.json").exists(), "the run went on training after SIGTERM"


@pytest.mark.slow
def test_sigterm_requeued_run_matches_uninterrupted_run(log_dir, reference, preempted):
    _train(log_dir, preempted)
    assert _outcome(log_dir, preempted) == reference


@pytest.mark.slow
def test_sigterm_during_validation_saves_the_finished_training_epoch(log_dir, reference):
    result = _train(
        log_dir,
        "preempted_in_validation",
        "+callbacks.crash._target_=_crash_helpers.SignalDuringValidation",
        "+callbacks.crash.epoch=1",
        "trainer.limit_val_batches=3",  # the signal must come before the last validation batch
        "data.eval_batch_size=16",
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    last = _run_dir(log_dir, "preempted_in_validation") / "checkpoints" / "last.ckpt"
    assert _ckpt_step(last) == 2 * STEPS_PER_EPOCH, "the second epoch's training was lost"
    # requeued: the interrupted validation runs again, then the last epoch; the same run as never interrupted
    _train(log_dir, "preempted_in_validation")
    assert _outcome(log_dir, "preempted_in_validation") == reference


def test_last_checkpoint_holds_the_final_step(log_dir, reference):
    # Lightning >= 2.5 refreshes last.ckpt only with a new top-k file; AtomicModelCheckpoint saves it every validation
    last = _run_dir(log_dir, "reference") / "checkpoints" / "last.ckpt"
    assert _ckpt_step(last) == TOTAL_STEPS


@pytest.mark.slow  # the SIGKILL test already compares two runs of the same seed (one killed and resumed)
def test_same_seed_gives_identical_runs(log_dir, reference):
    _train(log_dir, "again")
    assert _outcome(log_dir, "again") == reference


@pytest.mark.slow
def test_sigterm_to_the_process_group_with_data_workers_then_resume(log_dir, reference):
    """SIGTERM to every process of the run, the data workers too (`timeout`, SLURM): saved in epoch 0, resumed."""
    workers = ["data.num_workers=2", "data.persistent_workers=true"]
    group = ["+callbacks.crash._target_=_crash_helpers.SignalGroupAtStep", "+callbacks.crash.step=1"]
    result = _train(log_dir, "group_sigterm", *workers, *group, check=False, new_session=True)
    assert result.returncode == 0, f"SIGTERM to the group must end the run cleanly:\n{result.stderr[-3000:]}"
    assert _ckpt_step(_run_dir(log_dir, "group_sigterm") / "checkpoints" / "last.ckpt") == 2
    _train(log_dir, "group_sigterm", *workers)  # the data workers give the same samples as the main process
    assert _outcome(log_dir, "group_sigterm") == reference
