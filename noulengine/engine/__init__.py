"""The decision engine."""
