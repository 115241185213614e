"""Sources, parsing, chunking, embedding and the on-disk index."""
