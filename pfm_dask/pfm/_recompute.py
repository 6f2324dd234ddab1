__all__ = []  # placeholder, being written
