"""The CASE projection head g: Linear (no bias) -> LeakyReLU -> Dropout, saved as safetensors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from condsearch.base.artifact_files import HEAD_CONFIG, HEAD_WEIGHTS, check_own_artifact, write_json
from condsearch.base.atomic import replacing_dir
from condsearch.errors import ModelError
from condsearch.model.artifacts.heads import HeadConfig, head_checksum, head_meta, read_head_config
from condsearch.model.artifacts.weights import load_weights, save_weights


class ProjectionHead(nn.Module):
    """Map raw CASE vectors (n, input_dim) to index vectors (n, dim)."""

    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        self.config = config
        self.linear = nn.Linear(config.input_dim, config.dim, bias=False)
        self.act = nn.LeakyReLU(config.negative_slope)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.act(self.linear(x)))

    @torch.inference_mode()
    def project(self, vectors: np.ndarray) -> np.ndarray:
        """Project (n, input_dim) float32 vectors in eval mode: (n, dim) float32."""
        was_training = self.training
        self.eval()
        x = torch.from_numpy(np.ascontiguousarray(vectors, dtype=np.float32)).to(self.linear.weight.device)
        out = self(x)
        self.train(was_training)
        return out.cpu().numpy()


def save_head(head: ProjectionHead, directory: Path, extra: dict[str, object] | None = None) -> str:
    """Write the head's weights and config into ``directory`` atomically; return the checksum.

    ``directory`` must be missing, empty or an earlier head (ArtifactFolderError otherwise); weights
    with NaN or inf are refused (ModelError), leaving it as it was.
    """
    check_own_artifact(directory, "head")
    with replacing_dir(directory) as tmp:
        write_head_files(head, tmp, extra, shown=Path(directory))
    return head_checksum(directory)


def write_head_files(
    head: ProjectionHead, folder: Path, extra: dict[str, object] | None = None, *, shown: Path | None = None
) -> None:
    """Write the head's weights and config into an existing folder (callers make it atomic).

    ``shown``: the folder an error names (the final one, not the temporary folder written into).
    """
    state = {k: v.detach().cpu().contiguous() for k, v in head.state_dict().items()}
    save_weights(state, Path(folder) / HEAD_WEIGHTS, f"{shown or folder}: head weights")
    write_json(Path(folder) / HEAD_CONFIG, head_meta(head.config, extra))


def load_head(directory: Path) -> ProjectionHead:
    """Load a head saved by :func:`save_head`."""
    directory = Path(directory)
    head = ProjectionHead(read_head_config(directory))
    state = load_weights(directory / HEAD_WEIGHTS, "head weights")
    try:
        head.load_state_dict(state)
    except RuntimeError as exc:  # missing, unexpected or misshapen tensors
        raise ModelError(f"{directory}: head weights unreadable (they do not fit its {HEAD_CONFIG})") from exc
    return head.eval()
