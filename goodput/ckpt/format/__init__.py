"""What is on disk: names, manifest and metadata (:mod:`.format`, specified in docs/FORMAT.md),
the chunks' spatial index, block checksums, dtypes and box geometry. numpy only, torch-free."""
