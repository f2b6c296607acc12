"""The nemotron-rerank and mxbai-rerank-v2 prompts (the seed table's score templates), and when each is chosen."""
from poolgate.shared.inputs.score_templates import mxbai_rerank_v2, nemotron_rerank, template_for


def test_nemotron_rerank_is_question_then_passage_and_chosen_by_its_architecture():
    assert nemotron_rerank("what is x", "x is y", None) == "question:what is x \n \n passage:x is y"
    assert template_for({"architectures": ["LlamaBidirectionalForSequenceClassification"]}) == "nemotron_rerank"
    assert template_for({"architectures": ["LlamaBidirectionalModel"]}) is None  # the embedder reads no pairs
    assert template_for({"architectures": ["LlamaBidirectionalForSequenceClassification"],
                         "score_template": "mxbai_rerank_v2"}) == "mxbai_rerank_v2"  # the config's word wins


def test_mxbai_rerank_v2_is_qwens_chat_with_the_relevance_task():
    prompt = mxbai_rerank_v2("what is x", "x is y", None)
    assert prompt == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nquery: what is x\ndocument: x is y\nYou are a search relevance expert who evaluates how "
        "well documents match search queries. For each query-document pair, carefully analyze the semantic "
        "relationship between them, then provide your binary relevance judgment (0 for not relevant, 1 for "
        "relevant).\nRelevance:<|im_end|>\n<|im_start|>assistant\n")
    assert template_for({"score_template": "mxbai_rerank_v2"}) == "mxbai_rerank_v2"
