"""What a process runs on: its opened resources, background workers, circuit breakers,
tracing and rate-limited logs."""
