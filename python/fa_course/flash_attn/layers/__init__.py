"""FlashAttention's layers the course's shim carries: rotary embeddings."""
