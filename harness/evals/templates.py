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

# The convergence gate's held-out variant (``harness.evals.convergence``): the same four parts and the same retrieval
# (the question ends with the phrase that introduced the number), in other words and with another filler, so that
# the gate never scores a prompt a suite scores. No suite uses it (tests/test_gate.py); harness.contamination keeps it
# out of training data as it does the original.
PASSKEY_GATE_TASK = (
    "A number is kept somewhere inside the long text below, among many lines that do not matter. Find it and keep "
    "it in mind; you will be asked for it at the end."
)
PASSKEY_GATE_GARBAGE = "The snow is white. The sea is deep. The moon is pale. Off we go. Over the hills and home again."
PASSKEY_GATE_INFO = "The locker number is {pass_key}. Keep it safe. {pass_key} is the locker number."
PASSKEY_GATE_QUESTION = "Which locker number was given above? The locker number is"

# passkey's ``template`` argument -> (task, garbage, info, question)
PASSKEY_TEMPLATES = {
    "original": (PASSKEY_TASK, PASSKEY_GARBAGE, PASSKEY_INFO, PASSKEY_QUESTION),
    "gate": (PASSKEY_GATE_TASK, PASSKEY_GATE_GARBAGE, PASSKEY_GATE_INFO, PASSKEY_GATE_QUESTION),
}

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

# --- BABILong (Kuratov et al. 2024; booydar/babilong babilong/prompts.py, qa1-qa5; ’ quotes as in the original) --
BABILONG_TEMPLATE = "{instruction}\n{examples}\n{post_prompt}\n<context>\n{context}\n</context>\nQuestion: {question}"
BABILONG_PROMPTS = {
    "qa1": {
        "instruction": "I will give you context with the facts about positions of different persons hidden in some "
                       "random text and a question. You need to answer the question based only on the information "
                       "from the facts. If a person was in different locations, use the latest location to answer "
                       "the question.",
        "examples": "<example>\nCharlie went to the hallway. Judith come back to the kitchen. Charlie travelled to "
                    "balcony. Where is Charlie?\nAnswer: The most recent location of Charlie is balcony.\n"
                    "</example>\n\n<example>\nAlan moved to the garage. Charlie went to the beach. Alan went to the "
                    "shop. Rouse travelled to balcony. Where is Alan?\nAnswer: The most recent location of Alan is "
                    "shop.\n</example>",
        "post_prompt": "Always return your answer in the following format: The most recent location of ’person’ is "
                       "’location’. Do not write anything else after that. ",
    },
    "qa2": {
        "instruction": "I give you context with the facts about locations and actions of different persons hidden in "
                       "some random text and a question.You need to answer the question based only on the "
                       "information from the facts.\nIf a person got an item in the first location and travelled to "
                       "the second location the item is also in the second location. If a person dropped an item in "
                       "the first location and moved to the second location the item remains in the first location.",
        "examples": "<example>\nCharlie went to the kitchen. Charlie got a bottle. Charlie moved to the balcony. "
                    "Where is the bottle?\nAnswer: The bottle is in the balcony.\n</example>\n<example>\nAlan moved "
                    "to the garage. Alan got a screw driver. Alan moved to the kitchen. Where is the screw driver?\n"
                    "Answer: The screw driver is in the kitchen.\n</example>",
        "post_prompt": "Always return your answer in the following format: The ’item’ is in ’location’. Do not write "
                       "anything else after that.",
    },
    "qa3": {
        "instruction": "I give you context with the facts about locations and actions of different persons hidden in "
                       "some random text and a question. You need to answer the question based only on the "
                       "information from the facts.\nIf a person got an item in the first location and travelled to "
                       "the second location the item is also in the second location. If a person dropped an item in "
                       "the first location and moved to the second location the item remains in the first location",
        "examples": "<example>\nJohn journeyed to the bedroom.Mary grabbed the apple. Mary went back to the "
                    "bathroom. Daniel journeyed to the bedroom. Daniel moved to the garden. Mary travelled to the "
                    "kitchen. Where was the apple before the kitchen?\nAnswer: Before the kitchen the apple was in "
                    "the bathroom.\n</example>\n<example>\nJohn went back to the bedroom. John went back to the "
                    "garden. John went back to the kitchen. Sandra took the football. Sandra travelled to the "
                    "garden. Sandra journeyed to the bedroom. Where was the football before the bedroom?\nAnswer: "
                    "Before the kitchen the football was in the garden.\n</example>",
        "post_prompt": "Always return your answer in the following format: Before the $location_1& the $item$ was in "
                       "the $location_2$. Do not write anything else after that.",
    },
    "qa4": {
        "instruction": "I will give you context with the facts about different people, their location and actions, "
                       "hidden in some random text and a question. You need to answer the question based only on the "
                       "information from the facts.",
        "examples": "<example>\nThe hallway is south of the kitchen. The bedroom is north of the kitchen. What is "
                    "the kitchen south of?\nAnswer: bedroom\n</example>\n<example>\nThe garden is west of the "
                    "bedroom. The bedroom is west of the kitchen. What is west of the bedroom?\nAnswer: garden\n"
                    "</example>",
        "post_prompt": "Your answer should contain only one word - location. Do not write anything else after that.",
    },
    "qa5": {
        "instruction": "I will give you context with the facts about locations and their relations hidden in some "
                       "random text and a question. You need to answer the question based only on the information "
                       "from the facts.",
        "examples": "<example>\nMary picked up the apple there. Mary gave the apple to Fred. Mary moved to the "
                    "bedroom. Bill took the milk there. Who did Mary give the apple to?\nAnswer: Fred\n</example>\n"
                    "<example>\nJeff took the football there. Jeff passed the football to Fred. Jeff got the milk "
                    "there. Bill travelled to the bedroom. Who gave the football?\nAnswer: Jeff\n</example>\n"
                    "<example>\nFred picked up the apple there. Fred handed the apple to Bill. Bill journeyed to the "
                    "bedroom. Jeff went back to the garden. What did Fred give to Bill?\nAnswer: apple\n</example>",
        "post_prompt": "Your answer should contain only one word. Do not write anything else after that. Do not "
                       "explain your answer.",
    },
}

# --- HELMET recall (Yen et al. 2024; princeton-nlp/HELMET data.py load_json_kv / load_ruler) ----------------------
# json_kv: the prompt of nelson-liu/lost-in-the-middle kv_retrieval.prompt, context first (HELMET's order).
HELMET_JSON_KV_USER = ("{context}\n\nExtract the value corresponding to the specified key in the JSON object below."
                       "\n\n{demos}Key: {question}")
HELMET_JSON_KV_SYSTEM = "Corresponding value:"
JSON_KV_CONTEXT = "JSON data:\n"  # lost-in-the-middle kv_retrieval.prompt: the line before the object
HELMET_JSON_KV_DEMO = "Key: {key}\nCorresponding value:{value}"
# load_ruler: user template + "\n" + system template (RULER's answer prefix on its own line, no leading space).
HELMET_PROMPT_JOIN = "\n"

# --- HELMET's other categories (princeton-nlp/HELMET data.py; harness.evals.helmet) ---------------------------------
# RAG (load_qa): the user template with its demos and passages, the answer prefix on its own line
HELMET_RAG_USER = ("Use the given documents to write a concise and short answer to the question. Write your answer "
                   "in the following format:\nAnswer: [answer]\n\n{demos}{context}\n\nQuestion: {question}")
HELMET_RAG_DEMO = "{documents}\n\nQuestion: {question}\nAnswer: {answer}"
HELMET_RAG_PASSAGE = "Document (Title: {title}): {text}"
# re-ranking (load_msmarco_rerank); "relelvant" is the original's spelling
HELMET_RERANK_USER = ("You are provided with a list of documents, each indicated by their ID. Rank each document "
                      "based on their relevance to the question in descending order from most relelvant to least "
                      "relevant texts. Include all documents in the rankings. Write your answer using the unique IDs, "
                      "with the following format:\nRanking: ID3 > ID1 > ID2\n\n{demos}{context}\n\nQuery: {question}")
HELMET_RERANK_PASSAGE = "[ID: {id}] Document (Title: {title}): {text}"
HELMET_RERANK_PASSAGE_NO_TITLE = "[ID: {id}] Document: {text}"
# generation with citations (load_alce): the instruction, demo and document prompts come from the ALCE prompt files
HELMET_CITE_USER = "{demo_text}{instruction}\n\nQuestion: {question}\n\n{context}"
# long-document QA (load_narrativeqa, load_infbench)
HELMET_NARRATIVEQA_USER = ("You are given a story, which can be either a novel or a movie script, and a question. "
                           "Answer the question as concisely as you can, using a single phrase if possible.\n\n"
                           "{demo}{context}\n\nQuestion: {question}")
HELMET_INFBENCH_QA_USER = ("You are given a story and a question. Answer the question as concisely as you can, using "
                           "a single phrase if possible.\n\n{demo}{context}\n\nQuestion: {question}")
HELMET_INFBENCH_CHOICE_USER = ("You are given a story and a question with multiple choices. Choose the best answer "
                               "from the options provided. Only one of the following options is correct, output the "
                               "answer using one single letter (A, B, C, or D). Don't say anything else.\n\n{demo}"
                               "{context}\n\nQuestion: {question}\nOptions:\n{options}")
# summarisation (load_infbench sum_eng, load_multi_lexsum)
HELMET_INFBENCH_SUM_USER = ("You are given a book and you are tasked to summarize it. Write a summary of about 1000 to "
                            "1200 words. Only write about the plot and characters of the story. Do not discuss the "
                            "themes or background of the book. Do not provide any analysis or commentary.\n\n{demo}"
                            "{context}\n\nNow summarize the book.")
HELMET_MULTI_LEXSUM_USER = ("You are given the legal documents in a civil rights lawsuit, and you are tasked to "
                            "summarize the case. Write a concise summary of one paragraph (200 to 250 words). The "
                            "summary should contain a short description of the background, the parties involved, and "
                            "the outcomes of the case.\n\n{demo}Legal documents:\n{context}\n\nNow please summarize "
                            "the case.")

# --- LongBench v2 (Bai et al. 2024; THUDM/LongBench prompts/0shot.txt, the 0-shot no-CoT template) -----------------
LONGBENCH_V2_TEMPLATE = (
    "Please read the following text and answer the question below.\n\n<text>\n$DOC$\n</text>\n\nWhat is the correct "
    "answer to this question: $Q$\nChoices:\n(A) $C_A$\n(B) $C_B$\n(C) $C_C$\n(D) $C_D$\n\nFormat your response as "
    "follows: \"The correct answer is (insert answer here)\"."
)



# --- The checkpoint's own chat template (``chat_template: tokenizer`` in LongBench, ``model_template: tokenizer`` in
# RULER): off by default, since the controlled study evaluates base models without one ---------------------------
def tokenizer_chat_template(tokenizer, slot: str = "prompt") -> str:
    """A format string with one ``{slot}`` field: one user turn holding ``{slot}`` in ``tokenizer``'s own chat
    template, with the generation prompt (the assistant's turn) opened. Literal braces of the template are escaped.
    A ``ValueError`` when the tokenizer has no chat template (a base model)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the checkpoint's tokenizer has no chat template (a base model: use the evaluator's default)")
    marker = "\x00SLOT\x00"
    text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False,
                                         add_generation_prompt=True)
    bos = getattr(tokenizer, "bos_token", None)
    if bos and text.startswith(bos):  # the tokenizer adds its BOS itself when the prompt is encoded
        text = text[len(bos):]
    return text.replace("{", "{{").replace("}", "}}").replace(marker, "{" + slot + "}")
