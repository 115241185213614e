"""Evaluation: retrieval metrics over labelled questions."""
