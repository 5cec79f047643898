def main() -> int:
    """Placeholder."""
    return 0
