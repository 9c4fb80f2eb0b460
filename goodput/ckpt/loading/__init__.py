"""The load path, from :mod:`.loader` down: a committed checkpoint opened (:mod:`.reader`, numpy
only), which byte runs fill the requested regions (:mod:`.read_plan`), reading and verifying them
(:mod:`.read_exec`), targets that cannot be read into directly (:mod:`.load_staging`); a Hugging
Face safetensors directory enters the same plan (:mod:`.hf`)."""
