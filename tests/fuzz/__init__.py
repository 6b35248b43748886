"""The fuzz harness (README "Fuzzing"): craft (tiny GGUF files), targets, mutate, run."""
