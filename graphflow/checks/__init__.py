"""End-to-end correctness checks run by ``graphflow check``."""
