"""Other formats, in and out: a DCP checkpoint converted in (:mod:`.dcp_import`), and a goodput
checkpoint written out as consolidated Hugging Face safetensors or one torch file (:mod:`.exporter`,
which holds its destination by :mod:`.destination`'s marker)."""
