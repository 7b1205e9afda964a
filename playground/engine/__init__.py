"""The engine: everything that decodes. Imports no UI code."""
