"""Fine-tuning the encoder for CASE: LoRA adapters or all weights, with resumable checkpoints.

Submodules: ``lora`` (the adapter layers), ``adapter`` (adapter folders on disk),
``checkpoint`` (per-epoch training state), ``trainer`` (the training loop). Importing this
package loads none of them.
"""
