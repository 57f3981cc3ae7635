"""Training: small target-language PLMs built from scratch (``plm``), and language-adaptive pre-training."""
