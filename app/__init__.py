"""dsqa: retrieval-augmented Q&A for the DeepSpeed training library."""
