"""Verbatim evaluation templates, kept in one place.

The evaluators format their prompts from these strings, and the tiny model's synthetic training documents are
checked against them (``harness.data.synthetic`` refuses any document containing one of ``EVAL_FRAGMENTS``), so
that no evaluation template is ever seen verbatim in training: the study must measure retrieval, not a memorised
format.
"""

# --- Passkey retrieval: Mohtashami & Jaggi 2023, epfml/landmark-attention llama/run_test.py -----------------------
PASSKEY_TASK = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
    "I will quiz you about the important information there."
)
PASSKEY_GARBAGE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
PASSKEY_INFO = "The pass key is {pass_key}. Remember it. {pass_key} is the pass key."
PASSKEY_QUESTION = "What is the pass key? The pass key is"

# --- Needle in a Haystack: gkamradt/LLMTest_NeedleInAHaystack --------------------------------------------------
NIAH_NEEDLE = "\nThe best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.\n"
NIAH_QUESTION = "What is the best thing to do in San Francisco?"
# FranxYao / LCEG prompt for base HF models
NIAH_PROMPT = (
    "<|im_start|> This is a very long story book: <book> {context} </book>.\n"
    " Based on the content of the book, Question: {question}\nAnswer:"
)

# --- RULER (NVIDIA/RULER scripts/data/synthetic/constants.py, release 4f6507e) ---------------------------------
RULER_NIAH_NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."

EVAL_FRAGMENTS = (
    PASSKEY_TASK,
    PASSKEY_GARBAGE,
    "Remember it. ",
    PASSKEY_QUESTION,
    "best thing to do in San Francisco",
    "Dolores Park",
    "special magic",
    "This is a very long story book",
)
