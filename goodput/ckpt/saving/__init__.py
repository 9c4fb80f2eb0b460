"""The save path, from :mod:`.saver` down: the agreement and plan, the data files, the commit;
asynchronous saves add the host copy (:mod:`.staging`), the file-based commit (:mod:`.background`)
in a thread or a writer process, and tiers drain a fast commit to durable storage."""
