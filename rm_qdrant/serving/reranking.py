"""How DualIndex re-ranks and promotes (a mixin of :class:`~rm_qdrant.serving.dual.DualIndex`):
the search's ``rerank`` argument resolved against the pair's recorded default, the index's one
:class:`~rm_qdrant.serving.rerank.Reranker` and :class:`~rm_qdrant.serving.promote.Promoter`,
made at first use."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rm_qdrant.core.merge import Hit
from rm_qdrant.core.rerank import PAIR_DEFAULT, Rerank, as_rerank, recorded_rerank
from rm_qdrant.errors import ConfigError
from rm_qdrant.serving.promote import Promoter, PromotionCounts
from rm_qdrant.serving.rerank import Reranker
from rm_qdrant.sources import SourceConfig
from rm_qdrant.sources.settings import from_settings

if TYPE_CHECKING:
    from rm_qdrant.models.encoder import OnnxEncoder
    from rm_qdrant.pair.record import PairRecord
    from rm_qdrant.store import Store


class PairRerank:
    """The re-rank and the promotion of a pair's searches (DualIndex sets these)."""

    store: Store
    pair: PairRecord
    source: SourceConfig | None
    _reranker: Reranker | None
    _promoter: Promoter | None
    _closed: bool

    def _encoder(self) -> OnnxEncoder:
        raise NotImplementedError

    def _reranked(self, merged: list[list[Hit]], queries: np.ndarray, plan: Rerank) -> list[list[Hit]]:
        """Each merged list with its first ``plan.k`` re-ranked (and promoted, if the plan says so)."""
        promoting = self._promotions().offer if plan.promote else None
        return self._rescorer().rescore(merged, queries, plan, promote=promoting)

    def _rerank_plan(self, rerank: Rerank | int | str | None, promote: bool | None) -> Rerank | None:
        if rerank == PAIR_DEFAULT and isinstance(rerank, str):
            rerank = recorded_rerank(self.pair.rerank, self.pair.name)
            if rerank is None and promote:
                raise ConfigError(
                    f"promote=True needs a re-rank: pair {self.pair.name!r} has none recorded (give rerank=K)"
                )
        elif isinstance(rerank, str):
            raise ConfigError(f"rerank is K (an integer), a Rerank, or None, got {rerank!r}")
        return as_rerank(rerank, promote=promote)

    @property
    def promotions(self) -> PromotionCounts | None:
        """What this index's promotions did so far (None: no search promoted)."""
        return None if self._promoter is None else self._promoter.counts

    def _rescorer(self) -> Reranker:
        if self._closed:
            raise ConfigError("this DualIndex is closed: open another one to re-rank")
        if self._reranker is None:
            encoder = self._encoder()
            self._reranker = Reranker(
                self.pair, encoder, self.source or SourceConfig(**from_settings(self.pair.source or {}))
            )
        return self._reranker

    def _promotions(self) -> Promoter:
        if self._closed:
            raise ConfigError("this DualIndex is closed: open another one to promote")
        if self._promoter is None:
            self._promoter = Promoter(self.store, self.pair.name, self._encoder())
        return self._promoter
