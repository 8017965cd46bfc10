"""A party's checkpoints, privacy ledger and final model on disk.

Every ``checkpoint_interval`` rounds (and after the last) the party writes
``<checkpoints>/round-NNNNNN/{model.npz,state.json}`` atomically (:func:`write_checkpoint`); a resumed
run loads round R's files (:func:`load_checkpoint`) and drops any later ones.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
from pathlib import Path

import numpy as np

from confide import checkpoints as ckpt
from confide.errors import (
    InvalidParameterError,
    JobFailedError,
)
from confide.ml import WeightLayout
from confide.spec import JobSpec

__all__ = [
    "LEDGER",
    "drop_later_checkpoints",
    "final_leaf",
    "load_checkpoint",
    "load_privacy",
    "npz_bytes",
    "read_npz",
    "save_model",
    "write_checkpoint",
    "write_ledger",
]


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """The ``.npz`` bytes of named arrays."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def write_checkpoint(directory: Path, round_number: int, model, layout: WeightLayout, strategy, participants) -> None:
    """``weights.npz`` (the global model by tensor name), the strategy's and the model's local state."""
    state = {"round": round_number, "participants": list(participants), "format": 2, "layout": layout.to_dict()}
    files = {
        # Streamed to disk: a large model's checkpoint holds no archive of it in memory.
        "weights.npz": lambda file: np.savez(file, **model.get_weights()),
        "strategy.npz": npz_bytes(strategy.state()),
        "local.npz": npz_bytes(model.state() if hasattr(model, "state") else {}),
        "state.json": json.dumps(state, sort_keys=True).encode(),
    }
    target = directory / ckpt.round_name(round_number)
    if target.exists():  # a previous run of this session wrote it; this run's files replace it
        shutil.rmtree(target)
    ckpt.write_checkpoint(target, files)


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` archive; a file of another kind is a ``ValueError``."""
    loaded = np.load(path, allow_pickle=False)
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise ValueError(f"{path.name} is not an .npz archive")
    with loaded as npz:
        return {name: npz[name] for name in npz.files}


def load_checkpoint(directory: Path, round_number: int, model, layout: WeightLayout, strategy) -> None:
    """Restore round ``round_number``'s checkpoint into ``model`` and ``strategy``.

    Format 1 (before the model seam) held one flat ``weights.npy``; it loads into any model whose
    layout has that many values.
    """
    target = directory / ckpt.round_name(round_number)
    try:
        state = json.loads((target / "state.json").read_text())
        if not isinstance(state, dict):
            raise ValueError(f"state.json holds a {type(state).__name__}, not an object")
        if state.get("format", 1) == 1:
            flat = np.load(target / "weights.npy", allow_pickle=False)
            if not isinstance(flat, np.ndarray):
                raise ValueError("weights.npy is not one array")
            weights = layout.unflatten(flat) if flat.shape == (layout.size,) else None
            strategy_state, local = {}, {}
        else:
            weights = read_npz(target / "weights.npz")
            strategy_state = read_npz(target / "strategy.npz")
            local = read_npz(target / "local.npz")
    except ckpt.UNREADABLE_FILE_ERRORS as error:
        raise JobFailedError(f"cannot resume: checkpoint {target} is unreadable: {error}") from None
    if state.get("round") != round_number or weights is None:
        raise JobFailedError(
            f"cannot resume: checkpoint {target} holds round {state.get('round')}, expected round {round_number} "
            f"of a model with {layout.size} values"
        )
    try:
        weights = {name: weights[name] for name in (t.name for t in layout.tensors) if name in weights} or weights
        layout.check(weights, who=f"checkpoint {target}")
        model.set_weights(weights)
        strategy.load_state(strategy_state)
        if local and hasattr(model, "load_state"):
            model.load_state(local)
    except InvalidParameterError as error:
        raise JobFailedError(f"cannot resume: {error}") from None


#: The privacy ledger beside the checkpoints, rewritten after every round (a round released after
#: the last checkpoint still counts when the job resumes from it).
LEDGER = "privacy-ledger.json"


def write_ledger(directory: Path, privacy) -> None:
    """Write the privacy ledger (the budget spent so far) next to the checkpoints, atomically."""
    directory.mkdir(parents=True, exist_ok=True)
    temporary = directory / (LEDGER + ".tmp")
    temporary.write_text(json.dumps(privacy.state(), sort_keys=True))
    os.replace(temporary, directory / LEDGER)


def load_privacy(directory: Path, privacy) -> None:
    """Every round released before a resume, as it ran: they count against the budget."""
    path = directory / LEDGER
    try:
        privacy.load_state(json.loads(path.read_text()))
    except FileNotFoundError:
        raise JobFailedError(
            f"cannot resume with privacy: {path} is missing (the run was without differential privacy, or its "
            f"ledger was lost), so the rounds already run cannot be accounted"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise JobFailedError(f"cannot resume: privacy ledger {path} is unreadable: {error}") from None


def save_model(path: Path, model, layout: WeightLayout, spec: JobSpec) -> None:
    """The final global model: its tensors by name, with the layout and the model spec (JSON)."""
    meta = {"format": "confide.model/1", "layout": layout.to_dict(), "model": spec.model.model_dump(mode="json")}
    temporary = path.with_suffix(".tmp")
    with open(temporary, "wb") as handle:
        np.savez(handle, **model.get_weights(), **{"__confide__": np.array(json.dumps(meta))})
    os.replace(temporary, path)


def final_leaf(directory: Path, spec: JobSpec) -> dict | None:
    """The last round's checkpointed weights as a Merkle leaf (name, SHA-256), if it was checkpointed."""
    if not spec.checkpoint_interval:
        return None
    name = f"{ckpt.round_name(spec.rounds)}/weights.npz"
    path = directory / name
    if not path.exists():
        return None
    return {"round": spec.rounds, "name": name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def drop_later_checkpoints(directory: Path, resume_round: int) -> None:
    """Remove the checkpoints of rounds after ``resume_round``."""
    ckpt.drop_after(directory, resume_round)
