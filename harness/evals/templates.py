"""Verbatim evaluation templates, kept in one place.

The evaluators format their prompts from these strings, and the tiny model's synthetic training documents are
checked against them (``harness.data.synthetic`` refuses any document containing one of ``EVAL_FRAGMENTS``, which
``harness.contamination`` defines below the evaluators so the data builders need not import them), so that no
evaluation template is ever seen verbatim in training: the study must measure retrieval, not a memorised format.
"""
from harness.contamination import EVAL_FRAGMENTS  # noqa: F401  (re-exported: the filter lives on the ground floor)

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

# --- RULER (NVIDIA/RULER scripts/data/synthetic/constants.py, release 4f6507e; LCEG ruler/ is identical) --------
RULER_NIAH_NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
RULER_REPEAT_NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
RULER_QA_DOCUMENT = "Document {i}:\n{document}"
# kind -> tokens_to_generate, template, answer_prefix (the typo "assgined" is in the 2024 release and in lm-eval)
RULER_TASKS = {
    "niah": {
        "tokens_to_generate": 128,
        "template": "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize "
                    "it. I will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special "
                    "magic {type_needle_v} for {query} mentioned in the provided text?",
        "answer_prefix": " The special magic {type_needle_v} for {query} mentioned in the provided text are",
    },
    "variable_tracking": {
        "tokens_to_generate": 30,
        "template": "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
                    "{context}\nQuestion: Find all variables that are assigned the value {query} in the text above.",
        "answer_prefix": " Answer: According to the chain(s) of variable assignment in the text above, {num_v} "
                         "variables are assgined the value {query}, they are: ",
    },
    "common_words_extraction": {
        "tokens_to_generate": 120,
        "template": "Below is a numbered list of words. In these words, some appear more often than others. "
                    "Memorize the ones that appear most often.\n{context}\nQuestion: What are the 10 most common "
                    "words in the above list?",
        "answer_prefix": " Answer: The top 10 words that appear most often in the list are:",
    },
    "freq_words_extraction": {
        "tokens_to_generate": 50,
        "template": "Read the following coded text and track the frequency of each coded word. Find the three most "
                    "frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. Please "
                    "ignore the dots '....'. What are the three most frequently appeared words in the above coded "
                    "text?",
        "answer_prefix": " Answer: According to the coded text above, the three most frequently appeared words are:",
    },
    "qa": {
        "tokens_to_generate": 32,
        "template": "Answer the question based on the given documents. Only give me the answer and do not output "
                    "any other words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question "
                    "based on the given documents. Only give me the answer and do not output any other words.\n\n"
                    "Question: {query}",
        "answer_prefix": " Answer:",
    },
}
# RULER scripts/data/template.py: the model template wraps the task template; the answer prefix follows it.
RULER_MODEL_TEMPLATES = {"base": "{task_template}", "meta-chat": "[INST] {task_template} [/INST]"}
