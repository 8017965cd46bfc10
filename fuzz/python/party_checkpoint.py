"""Fuzz target: a party resuming from a checkpoint on disk (``confide.party.checkpointing.load_checkpoint``).

The input is the checkpoint's files in 4-byte length frames: ``state.json``, ``weights.npz``,
``strategy.npz``, ``local.npz`` and (format 1) ``weights.npy``; missing frames are missing
files. The model is a Homo LR with four features and the strategy FedAdam (it has state). A
damaged checkpoint must stop the job with a :class:`JobFailedError` that names it, never with a
``KeyError``, ``AttributeError`` or ``BadZipFile`` from deep inside.
"""

from __future__ import annotations

from pathlib import Path

import _common

with _common.instrumented(__name__):
    from confide.checkpoints import round_name
    from confide.errors import JobFailedError
    from confide.ml import WeightLayout
    from confide.ml.homo_lr import HomoLR, HomoLRModel
    from confide.ml.strategies import make_strategy
    from confide.party import checkpointing

ALLOWED = (JobFailedError,)
ROUND = 3
FILES = ("state.json", "weights.npz", "strategy.npz", "local.npz", "weights.npy")
_directory: list[Path] = []


def model_and_layout() -> tuple[HomoLRModel, WeightLayout]:
    """The model the checkpoints are loaded into (also used by fuzz/make_corpus.py)."""
    model = HomoLRModel(HomoLR())
    model.build((4,), 2)
    return model, WeightLayout.of(model.get_weights())


def fuzz_one(data: bytes) -> None:
    """Write the input's files as round ``ROUND``'s checkpoint and resume from it."""
    if not _directory:
        _directory.append(_common.scratch("checkpoint"))
    target = _directory[0] / round_name(ROUND)
    target.mkdir(parents=True, exist_ok=True)
    for path in target.iterdir():
        path.unlink()
    for name, content in zip(FILES, _common.frames(data), strict=False):
        (target / name).write_bytes(content)
    model, layout = model_and_layout()
    checkpointing.load_checkpoint(_directory[0], ROUND, model, layout, make_strategy("fedadam"))


if __name__ == "__main__":
    _common.main(fuzz_one, ALLOWED)
