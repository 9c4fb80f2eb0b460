"""The end-to-end demo (placeholder until written below)."""
