"""The plugin's kernels and the hooks that launch them (no module here imports the patch layer)."""
