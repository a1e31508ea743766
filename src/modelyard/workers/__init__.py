"""Where a model runs: inline in the server process, or in its own worker process."""
