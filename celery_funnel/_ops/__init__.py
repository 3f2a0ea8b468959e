"""Operations: "funnel name -> its keys" (``view``), live control (``control``; the
public ``celery_funnel.control`` re-exports it) and the worker's live thread."""
