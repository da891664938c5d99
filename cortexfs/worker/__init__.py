"""Queue workers (SPEC §3): claim a job, run it, finish it, exactly once whatever crashes."""
