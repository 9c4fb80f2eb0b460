"""The live service: the HTTP API and its store, the job-side client, tenants as Unix users, and the
executors that start real processes (locally, or through Slurm).
"""
