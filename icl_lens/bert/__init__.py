"""R&L Table 1's modifications inside a Hugging Face BERT: the patch (:mod:`icl_lens.bert.modify`),
the GLUE fine-tuning runner (:mod:`icl_lens.bert.glue`) and the offline stand-in for RTE built from
WordNet (:mod:`icl_lens.bert.wordnet`). Needs the optional extra ``pip install -e .[bert]``.

Chapters: bert.
"""
