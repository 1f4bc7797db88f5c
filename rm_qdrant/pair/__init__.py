"""The pair and what it stores: the record (record.py), its layout (layouts/: where each half is and
how writes, a migration batch, cutover, rollback and drop act on it), writers that bypass
rm-qdrant (bypass.py), and the batch records every layout writes (outcome.py, confirm.py,
upkeep.py). Imports core, store, sources and models only."""
