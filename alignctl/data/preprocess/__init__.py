"""alignctl.data.preprocess."""
