"""What a run trains: models, synthetic data and the training loop."""
