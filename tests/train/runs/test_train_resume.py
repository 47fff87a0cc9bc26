"""A run interrupted after an epoch and resumed ends exactly where the uninterrupted run ends."""

from __future__ import annotations

import json

import pytest
import torch
from _crash_helpers import SignalAtStep, SignalDuringValidation
from _run_state import assert_same_run, run_state
from lightning.pytorch import Callback
from train_helpers import FAST, TINY_TIMM, compose

from linvit.train.runs.run import train


class StopAfterFirstEpoch(Callback):
    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch == 0:
            trainer.should_stop = True


def _weights(run_dir):
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    return checkpoint["global_step"], checkpoint["state_dict"]


def test_resumed_run_matches_uninterrupted(tmp_path, tiny_overrides):
    # randomness everywhere: augmentation, mixup, drop path, shuffling; EMA and a per-step schedule
    overrides = [
        *tiny_overrides,
        "trainer.max_epochs=2",
        "+trainer.limit_train_batches=4",
        "+trainer.limit_val_batches=2",
        "+model.model_kwargs.drop_path_rate=0.1",
        "model.mixup.mixup_alpha=0.4",
        "test=false",
        "export.enabled=false",
    ]
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    metrics_straight = train(compose(overrides, straight))
    train(compose(overrides, interrupted), callbacks=[StopAfterFirstEpoch()])
    step_half, _ = _weights(interrupted)
    assert step_half == 4
    metrics_resumed = train(compose(overrides, interrupted))  # resume: true finds checkpoints/last.ckpt

    step_a, weights_a = _weights(straight)
    step_b, weights_b = _weights(interrupted)
    assert step_a == step_b == 8
    assert weights_a.keys() == weights_b.keys()
    for key in weights_a:
        torch.testing.assert_close(weights_b[key], weights_a[key], rtol=1e-5, atol=1e-6, msg=key)
    for key in ("val/acc1", "val/loss", "val_ema/acc1"):
        assert metrics_resumed[key] == metrics_straight[key]
    assert json.loads((interrupted / "metrics.json").read_text())["val/loss"] == metrics_straight["val/loss"]
    # the CSV continues and the learning-curve history covers both epochs
    assert (interrupted / "learning_curves.png").stat().st_size > 0
    rows = (interrupted / "metrics.csv").read_text().splitlines()
    assert sum(1 for row in rows[1:] if row.split(",")[0] != "") >= 2


def test_explicit_ckpt_path(tmp_path, tiny_overrides):
    overrides = [*tiny_overrides, "trainer.max_epochs=1", "+trainer.limit_train_batches=2", "test=false"]
    overrides += ["+trainer.limit_val_batches=1", "export.enabled=false"]
    train(compose(overrides, tmp_path / "first"))
    ckpt = tmp_path / "first" / "checkpoints" / "last.ckpt"
    overrides[overrides.index("trainer.max_epochs=1")] = "trainer.max_epochs=2"
    train(compose([*overrides, f"ckpt_path={ckpt}"], tmp_path / "second"))
    step, _ = _weights(tmp_path / "second")
    assert step == 4


# -- SIGTERM at the moments that used to lose something (the slow tier sweeps every moment: test_resume_sweep.py) --
SIGTERM_RUN = [
    *TINY_TIMM,
    *FAST,
    "trainer.max_epochs=2",
    "+trainer.limit_train_batches=3",
    "+trainer.limit_test_batches=1",
    "model.ema.enabled=true",
    "trainer.log_every_n_steps=1",
]
VALIDATIONS = {
    "two_val_batches": ["data.eval_batch_size=4", "+trainer.limit_val_batches=2"],  # a signal can land inside
    "one_val_batch": ["+trainer.limit_val_batches=1"],
}


@pytest.fixture(scope="module")
def sigterm_runs(tmp_path_factory):
    runs, references = tmp_path_factory.mktemp("sigterm"), {}

    def reference(validation):
        if validation not in references:
            train(compose(SIGTERM_RUN + VALIDATIONS[validation], runs / f"reference_{validation}"))
            references[validation] = run_state(runs / f"reference_{validation}")
        return references[validation]

    return runs, reference


@pytest.mark.parametrize(
    "validation, moment",
    [
        # the SIGTERM save came before the module's EMA update of that step: every EMA tensor was one update behind
        pytest.param("two_val_batches", SignalAtStep(1, "SIGTERM"), id="mid-epoch-ema"),
        # the final validation was cut short and skipped on resume: best.ckpt of epoch 0 was tested and exported
        pytest.param("two_val_batches", SignalAtStep(5, "SIGTERM"), id="last-step"),
        pytest.param("two_val_batches", SignalDuringValidation(1, "SIGTERM"), id="final-validation"),
        # the SIGTERM save after the final validation replaced its last.ckpt; the resume logged no metrics
        pytest.param("one_val_batch", SignalAtStep(5, "SIGTERM"), id="last-step-one-val-batch"),
        # should_stop made Lightning validate at once and write best.ckpt mid-epoch
        pytest.param("one_val_batch", SignalAtStep(4, "SIGTERM"), id="late-in-epoch-one-val-batch"),
    ],
)
def test_sigterm_then_resume_matches_the_uninterrupted_run(sigterm_runs, validation, moment, request):
    runs, reference = sigterm_runs
    run_dir = runs / request.node.callspec.id
    overrides = SIGTERM_RUN + VALIDATIONS[validation]
    with pytest.raises(SystemExit) as stopped:
        train(compose(overrides, run_dir), callbacks=[moment])
    assert stopped.value.code in (None, 0)
    assert not (run_dir / "metrics.json").exists(), "the run went on after SIGTERM"
    train(compose(overrides, run_dir))
    assert_same_run(reference(validation), run_state(run_dir), "the resumed run")
