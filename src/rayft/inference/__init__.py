"""Interactive inference over a generation backend: ``rayft chat`` conversations and prompt files."""
