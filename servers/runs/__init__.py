"""Real runs: readers of the logs that RL and training frameworks write (verl's file logger, TRL's
trainer_state.json, TensorBoard event files, MLflow, W&B), one registry of them, one metric vocabulary, and the
compute axis derived from a run. A layer of its own between servers/core and the servers: it imports servers/core
only, and launch and scaling use it. No MCP imports here."""
