"""Operations on a pair and its collections: ``rmq init`` (create.py), ``rmq index``
(indexing.py), ``finalize``/``rollback`` (cutover.py), ``drop-pair`` (drop.py), failures,
``switch-encoder`` (switch.py) and ``model check`` (verify.py). Imports migration/ and below."""
