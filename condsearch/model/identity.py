"""What identifies the model behind an index: one record, read from a loaded vectorizer or from a manifest.

An index's manifest records it when the index is built (:meth:`ModelIdentity.of_vectorizer`, the
fields the manifest will hold), and a reader reads it back (:meth:`ModelIdentity.of_manifest`). Two
digests come from it, for two questions:

- :attr:`ModelIdentity.key`: which loaded model may answer an index. Indexes with equal keys share
  one loaded copy (the server, the Python API); the profile's name is part of it, since it says what
  to load.
- :attr:`ModelIdentity.fingerprint`: what a row's vector depends on besides its text and condition
  (:func:`condsearch.store.vectors.vector_fingerprint`), recorded with the vectors an index keeps for
  incremental reuse. It leaves out what changes no vector (a ``--dtype auto`` choice within its
  measured bound, a profile's name), and its formula is part of the stored format.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from condsearch.model.encoders.spec import EncoderSpec
from condsearch.store.vectors import vector_fingerprint

if TYPE_CHECKING:
    from condsearch.model.vectorizer import Vectorizer
    from condsearch.store.manifest import Manifest


@dataclass(frozen=True)
class ModelIdentity:
    """The model, revision, encoder settings, mode, profile and head an index records (its manifest's names)."""

    model_id: str
    model_revision: str
    encoder: dict[str, object]  # the encoder's describe(): pooling, prompts, max_length, dtype, adapter and router
    mode: str
    head: str  # the profile's name
    head_checksum: str
    dim: int
    spec: dict[str, object]  # EncoderSpec.to_dict() of what was loaded ({} in a manifest before format 5)

    @classmethod
    def of_vectorizer(cls, vectorizer: Vectorizer) -> ModelIdentity:
        """Return what an index built by vectorizer records, before the index exists."""
        enc = vectorizer.encoder
        return cls(
            enc.model_id,
            enc.revision,
            enc.describe(),
            vectorizer.mode,
            vectorizer.profile_name,
            vectorizer.head_checksum,
            vectorizer.dim,
            vectorizer.spec.to_dict(),
        )

    @classmethod
    def of_manifest(cls, manifest: Manifest) -> ModelIdentity:
        """Return what an index records of the model that built it."""
        return cls(
            manifest.model_id,
            manifest.model_revision,
            manifest.encoder,
            manifest.mode,
            manifest.head,
            manifest.head_checksum,
            manifest.dim,
            manifest.spec,
        )

    @property
    def encoder_spec(self) -> EncoderSpec:
        """Return the spec that loads the model again (read from the encoder record where no spec is recorded)."""
        return EncoderSpec.of_manifest(self)  # the fields it reads are named alike

    @property
    def fingerprint(self) -> str:
        """Return the sha256 of what a row's vector depends on besides its text and condition."""
        return vector_fingerprint(self.encoder, mode=self.mode, head_checksum=self.head_checksum, dim=self.dim)

    @property
    def key(self) -> str:
        """Return what identifies the loaded model an index needs: indexes with equal keys share one copy."""
        from condsearch.model.artifacts.profiles import recorded_profile

        fields = {
            "model_id": self.model_id,
            "model_revision": self.model_revision,
            "mode": self.mode,
            "head": recorded_profile(self.head),  # an older index's 'default' is 'lora'
            "head_checksum": self.head_checksum,
            "encoder": self.encoder,  # pooling, prompts, max_length, dtype, adapter and router fingerprints
        }
        return json.dumps(fields, sort_keys=True, default=str)
