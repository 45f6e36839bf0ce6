"""`agrpo run CONFIG`: one job on one machine, vLLM included, under a supervisor."""
