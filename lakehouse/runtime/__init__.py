"""The process and its resources: Spark (`spark`), start-up and exit (`startup`), outages, retries, coordination between processes, file permissions, S3 clients, preflight checks."""
