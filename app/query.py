"""What a user's question asks, apart from the story around it.

Real questions arrive as GitHub issues and chat messages: a paragraph of context ("we're
fine-tuning a 13B model on 4 nodes and ..."), maybe a log line, then the ask. `split_question`
separates the ask (questions, requests, quoted errors) from the context, so the retriever can
weigh the ask more. Pure functions; English and Chinese.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from app.glossary import has_cjk
from indexer.tokenize import tokenize

_SENTENCE_END = re.compile(r"(?<=[.!?。！？])\s+|(?<=[。！？；])|\n+")
_ASK_EN = re.compile(
    r"^(how|what|why|which|where|when|who|is|are|can|could|does|do|did|should|would|will|any|has|have|"
    r"please|pls|tell|explain|help|i need|i want|i'd like|is there|are there)\b",
    re.IGNORECASE,
)
_ASK_ZH = re.compile(r"[？?]|吗|么|如何|怎样|怎么|什么|为什么|为何|是否|能否|可否|哪|有没有|请问|求")
_ERROR = re.compile(r"\b\w*(error|exception|traceback|assert\w*|warning)\b|^\s*\w+(\.\w+)*:\s", re.IGNORECASE)


# what documentation never gives: a date or roadmap, a price or budget, an opinion, a measured number
_UNKNOWABLE = re.compile(
    r"\bwhen (was|will|is|did)\b|what date|release date|\broadmap\b|什么时候|哪天|何时|预计.*发"
    r"|\$\s?\d|\bcost\b|\bprice|per hour|\bbudget|\bcheaper|\brent\b|多少钱|价格|预算|租|划算"
    r"|would you|\bprefer\b|\bhonestly\b|worth (it|betting|trying)|\brecommend|靠谱|值得|推荐|说实话"
    r"|how many (samples|tokens)|how much faster|samples/s|tokens/s|\btflops\b|ballpark|快多少|大概多少|多少 ?tflops",
    re.IGNORECASE,
)


# the precise part of the above, a feature of its own: a plan or timeline, a figure the user expects to
# measure, what people make of it in practice. None of tune's 374 answerable questions says any of these
# (the broad pattern above matches 14 of them: "recommend", "cost", "budget"); 61 of its 210 unanswerable
# ones do. As its own coverage feature, tune CV refused 80.2% -> 88.5% of the unanswerable questions
# (at the 1.5% conformal quantile, `eval/abstention_training.py`)
_PLAN_OR_FIGURE = re.compile(
    r"\b(is|are) there (any )?(plans?|a (timeline|timeframe|target date|date)|an eta)\b|\bplanned (release|support|date)"
    r"|\btime ?frame\b|\btimeline\b|\beta\b|\btarget (date|version|release)|\bwhen (was|will|did)\b|what date|release date"
    r"|\broadmap\b|排期|有没有计划|计划(什么时候|何时|在哪)|路线图|哪天|何时|预计.*发|大概什么时候|什么时候(出|发布|支持|会支持|能支持)"
    r"|\b(should|can|could|would) (i|we) expect\b|\bhow long (does|do|will|would|did) .{0,80}\btakes?\b|per[- ]token latency"
    r"|\bwhat step time\b|\b(published|measured|reported) (number|figure|speedup|result|benchmark)s?\b|\bany (measured|published) "
    r"|how much faster|ballpark|快多少|大概多少|每秒.{0,12}多少|多少 ?token|应该能跑|正常.{0,8}(多少|多快|算正常)|要跑多久|需要多久|多长时间"
    r"|\$\s?\d|per hour|多少钱|价格|would you|\bhonestly\b|靠谱|值得|说实话"
    r"|\bhave you found\b|\bin your experience\b|\bdo (people|folks|you) (still )?(use|prefer|recommend)|\bwhich (one )?(would|do) you\b"
    r"|\bwould impress|大家(实际|一般|还会|都|平时)|哪个.{0,16}(坑更少|更好用|更友好|更顺|更适合)",
    re.IGNORECASE,
)


def asks_plan_or_figure(question: str) -> bool:
    """Whether the question asks for a plan or timeline, a figure it expects to measure, or others'
    experience, in words precise enough that answerable questions do not use them (`_PLAN_OR_FIGURE`)."""
    return bool(_PLAN_OR_FIGURE.search(question))


# frameworks beside DeepSpeed whose own options and internals a question may ask about ("accelerate launch
# num_processes", "How does bitsandbytes' 8-bit AdamW store its state?"). Not named here: ones the DeepSpeed docs
# teach with it (Megatron, Lightning, transformers, wandb, Slurm) and DeepSpeed's own words ("accelerator").
_OTHER_LIBRARY = re.compile(r"\b(accelerate|colossal-?ai|fsdp|bitsandbytes|bnb|vllm|xtuner|llama-?factory|peft|trl|horovod|fairscale|"
                            r"jax|tensorflow|keras|pandas|sglang|tensorrt-llm|nemo|axolotl|unsloth|torchtitan)\b", re.IGNORECASE)
_DEEPSPEED_NAMED = re.compile(r"deepspeed|zero|ds_config", re.IGNORECASE)


def asks_other_library(question: str) -> bool:
    """Whether the question names another training or serving framework and nothing of DeepSpeed's. Of the tune
    questions: 1 of 374 answerable and 0 of 94 terse answerable ones do; 9 of 299 unanswerable ones (7 of the 42
    about other libraries), 12 of 64 terse unanswerable ones, and 23 of the 626 training-only ones."""
    return bool(_OTHER_LIBRARY.search(question)) and not _DEEPSPEED_NAMED.search(question)


# which release first had a feature: release notes say that, the docs seldom do
_FIRST_RELEASE = re.compile(
    r"\b(which|what) (deepspeed |ds )?(version|release)s?\b.{0,40}\b(introduc|add|ship|land|support|start|first|began|br(ing|ought)|got)"
    r"|\bsince (which|what) (deepspeed |ds )?(version|release)|\bfirst (shipped|added|introduced|appeared|had)\b.{0,30}\b(version|release)"
    r"|\b(version|release) (that )?(first )?(introduced|added)\b"
    r"|哪个版本(开始|加|引入|支持|才|有)|从哪个.{0,12}版本|哪一?版.{0,6}(开始|加入|引入)|什么版本(开始|加入|引入|才)",
    re.IGNORECASE,
)


def asks_first_release(question: str) -> bool:
    """Whether the question asks which release first had a feature (a signal for the coverage
    decision of its own: folded into `asks_unknowable` it moved nothing on tune's cross-validation)."""
    return bool(_FIRST_RELEASE.search(question))


# a yes-or-no question whether something was removed or deprecated (not when or in which release)
_WHETHER_REMOVED = re.compile(
    r"^\W*(was|were|is|are|has|have|did|does)\b[^?]{0,120}\b(removed|deprecated|dropped|gone|still (supported|available|there))\b"
    r"|(被)?(移除|删除|删掉|废弃|弃用)了?(吗|么)",
    re.IGNORECASE,
)
_WHEN_OR_WHICH = re.compile(r"\b(when|which|what) (deepspeed |ds )?(version|release|date)?|什么时候|哪个版本|哪一?版|什么版本", re.IGNORECASE)


def asks_whether_removed(question: str) -> bool:
    """Whether the question asks only whether something was removed or deprecated ("Was the elasticity
    block removed?"): the installed deepspeed's own status of a key answers that (`app/answer_shapes.status_line`),
    where it cannot say when or in which release."""
    return bool(_WHETHER_REMOVED.search(question)) and not _WHEN_OR_WHICH.search(question)


def asks_unknowable(question: str) -> bool:
    """Whether the question asks for what documentation does not hold: a date or roadmap, a price or
    budget, an opinion or recommendation, a measured throughput. A signal for the coverage decision,
    which weighs it with the retrieval signals (an answerable question may match too)."""
    return bool(_UNKNOWABLE.search(question))


# Chinese words of a question's phrasing ("what does it mean / do", why, how to configure, cannot get, two
# machines, model, default...): the glossary expands them for the search, but they name nothing a reader needs
# translated, so an answer's terms line (`app/ask.terms_line`) leaves them out
QUESTION_WORDS_ZH = frozenset((
    "为什么 如何 怎么配置 干什么用 是干什么 作用 意思 含义 用法 示例 例子 教程 文档 "
    "官方文档 原理 区别 对比 相比 推荐 建议 经验 最佳实践 选择 优缺点 注意事项 临时方案 "
    "绕过 完整 完整的 整体 拿到 拿不到 取出 是空的 为空 训完 训练完 推出来 合成一个 "
    "合并成 放进 设成 影响 全部 当前 提前 叠加 时机 不生效 生效 跑不起来 速度慢 没反应 "
    "卡着不动 无响应 台机器 两台机器 显示器 模型 训练 数据 支持 不支持 不同 相同 同一 "
    "一致 原因 导致 解决 修复 方法 方案 过程 步骤 流程 情况 场景 条件 前提 限制 直接 "
    "现成 自带 官方 手动 手工 继续 重新 显示 识别 退出 次数 最优 减半 额外 调用 指定 "
    "默认 代码 命令 输出 输入 本地 更新 自定义 模式 时间 范围 变化 改变 修改 删除 添加 "
    "增加 减少 提高 提升 降低 下降 上升 升高 一直 频繁 处理 保留 最大 最小 分钟 创建 "
    "临时 要求 效果 稳定 不稳定 震荡 报告 统计 提交 地址 机器 单机 脚本 文件 路径 函数 "
    "类 对象 属性 变量 返回 返回值 警告 失败 成功 重复 替换 包 模块 子模块 形状 维度 "
    "跳过 估计 分析 机制 进度 循环 执行 全局 占用 上限 下限 等价 替代 代替 差异 价值 "
    "策略 指令 文本 图像 视频 视觉 资源 作业 队列 结构 规模 "
).split())

# the words of a question that asks only what a config key is, does or defaults to
_DEFINING_EN = frozenset(
    "what whats what's does do did is are the a an this that config configuration configs option setting "
    "parameter param flag field key deepspeed ds json in of mean means meaning for used use purpose "
    "control controls explain describe please default value type exactly it "
    "zero stage 0 1 2 3 "  # the stage the key belongs to: "zero3 的 stage3_prefetch_bucket_size 是干什么的"
    "difference between and vs versus compare differ differs "  # two keys set side by side: each entry answers its half
    "how they buy me gain benefit help helps with work works "  # what a key is for, in plainer words
    "i can to set use using enable disable configure turn on off change adjust".split()  # how to set it: the entry's
)  # type, default and section say (the coverage decision refused 123 of 205 "How do I set <key>?")
_DEFINING_ZH = re.compile(r"怎么|如何|怎样|设置|使用|配置成|开启|打开|关闭|是什么意思|什么意思|是干什么的|干什么的|干什么|有什么用|有啥用|的作用是什么|作用是什么|作用|"
                          r"是什么|是啥|默认值是多少|默认值|默认是多少|请问|一下|解释|这个|参数|配置|选项|里的|中的|的|是|吗|呢|啊|中|里|用|和|与|跟")


def asks_only_what_key_is(question: str, keys: list[str]) -> bool:
    """Whether the question asks nothing but what the named config keys (dotted paths) are, do, default to
    or how to set them ("What does overlap_comm do?", "stage3_max_live_parameters 是什么意思", "How do I set
    overlap_comm?"): what the config catalogue's entry of a key answers by itself (or an API page, for API
    symbols' paths: "What does TiledLinear do?"). Every word beside the keys, their dotted endings, the
    sections they sit in and punctuation must be one of a few defining words; any other word (a version, a value, a symptom, a
    comparison) asks more."""
    if not keys:
        return False
    text = question.lower()
    for path in sorted(keys, key=len, reverse=True):
        parts = path.lower().split(".")
        for i in range(len(parts)):  # the whole path, then each dotted ending
            text = text.replace(".".join(parts[i:]), " ")
        for part in parts:  # and the sections it sits in, named apart ("zero_optimization 里的 overlap_comm")
            text = re.sub(rf"(?<![\w.]){re.escape(part)}(?![\w.])", " ", text)
    text = _DEFINING_ZH.sub(" ", text)
    words = re.findall(r"[a-z']+|\d+|[^\W\d_a-z]+", text)
    return all(w in _DEFINING_EN for w in words)


def _asks_only_about(text: str, symbols: list[str]) -> bool:
    """Whether `text` (a question less the words of what it asks: return, argument, ...) asks nothing but what the API
    `symbols` are (`asks_only_what_key_is`), once the user's own object before a method's name is set aside
    ("model_engine.load_checkpoint")."""
    for path in symbols:
        text = re.sub(rf"[\w.]+\.(?={re.escape(path.rsplit('.', 1)[-1])}\b)", "", text)
    return asks_only_what_key_is(text, symbols)


# "What does X return?", "X 返回什么": what a docstring's Returns section answers
_RETURNS = re.compile(r"\breturn(?:s|ed(?: by)?)?\b(?: values?)?|返回(?:值|的)?(?:是)?(?:什么|啥)?", re.I)


def asked_what_returns(question: str, paths: Iterable[str]) -> list[str]:
    """The API symbols (of the dotted `paths`) a question names and asks nothing about but what they return ("What
    does deepspeed.initialize return?", "engine.load_checkpoint 返回什么"); [] for any other question."""
    if not _RETURNS.search(question):
        return []
    symbols = api_names_in(question, paths, after_any_object=True)
    return symbols if _asks_only_about(_RETURNS.sub(" ", question), symbols) else []


# "What does the config argument of deepspeed.initialize do?", "init_inference 的 mp_size 参数是什么"
_ARGUMENT_WORD = re.compile(r"\b(?:arguments?|args?|parameters?|params?|kwargs?|keyword)\b|参数", re.I)


def mentions_argument(question: str) -> bool:
    """Whether the question says argument (or parameter, kwarg, 参数): what a question about an argument must say."""
    return _ARGUMENT_WORD.search(question) is not None


def asks_what_argument_is(question: str, symbol: str, argument: str) -> bool:
    """Whether the question asks nothing but what `argument` of the API function or method `symbol` is or does: it
    says argument (or parameter, 参数), and its other words are those of a question asking only what the symbol is."""
    if not mentions_argument(question):
        return False
    text = re.sub(rf"(?<![\w.]){re.escape(argument)}(?![\w])=?", " ", question)
    return _asks_only_about(_ARGUMENT_WORD.sub(" ", text), [symbol])


# "What arguments does deepspeed.initialize take?", "PipelineModule 有哪些参数": the signature answers
_ARGUMENTS_LISTED = re.compile(r"\b(?:what|which)(?: keyword)? (?:arguments|parameters|args|params|kwargs)\b(?: (?:does|do|can|will))?"
                               r"|\b(?:take|takes|accept|accepts)\b|有哪些参数|哪些参数|参数有哪些|参数列表|的参数都有什么", re.I)


def asked_what_arguments(question: str, paths: Iterable[str]) -> list[str]:
    """The API symbols (of the dotted `paths`) a question names and asks nothing about but which arguments they take
    ("What arguments does deepspeed.initialize take?", "PipelineModule 有哪些参数？"); [] for any other question."""
    if not (_ARGUMENTS_LISTED.search(question) and mentions_argument(question)):
        return []
    symbols = api_names_in(question, paths, after_any_object=True)
    return symbols if _asks_only_about(_ARGUMENT_WORD.sub(" ", _ARGUMENTS_LISTED.sub(" ", question)), symbols) else []


_API_NAME = re.compile(r"^(?:[A-Z][a-z0-9]+){2,}[A-Za-z0-9]*$|^[a-z][a-z0-9]*(?:_[a-z0-9]+)+$")  # TiledLinear, safe_get_full_grad


def api_names_in(question: str, paths: Iterable[str], *, after_any_object: bool = False) -> list[str]:
    """The API symbols (dotted paths) a question names: by the whole path, by a dotted ending of two or more
    names ("zero.Init"), or by the last name when it is distinctive (CamelCase or snake_case, written as a
    word: "What does TiledLinear do?"; not "Init"). `after_any_object`: a method's distinctive name also after
    the user's own object ("model_engine.load_checkpoint")."""
    named = []
    before = r"(?<![\w])" if after_any_object else r"(?<![\w.])"
    for path in paths:
        parts = path.split(".")
        last = parts[-1]
        # the names it goes by, written as a word: a distinctive last name, a dotted ending ("zero.Init", "comm.all_reduce")
        names = ([last] if _API_NAME.match(last) else []) + [".".join(parts[i:]) for i in range(1, len(parts) - 1)]
        if path in question or (last in question and any(re.search(rf"{before}{re.escape(n)}(?![\w])", question) for n in names)):
            named.append(path)
    # a class named as the start of its method's name gives way to the method ("DeepSpeedEngine.step")
    return [p for p in named if not any(other.startswith(f"{p}.") for other in named)]


_ASKING = re.compile(r"[?？]|\b(?:what|how|why|when|where|which|who|whose|is|are|can|could|does|do|did|should|would|will|may|might|"
                     r"must|has|have|i|my|me|we|you)\b", re.I)
KEYWORD_WORDS = 6
# the words of a keyword search that say what kind of page is wanted, not what it is about (stemmed as indexed)
SEARCH_WORDS = frozenset(tokenize("example examples usage format config configuration tutorial guide docs documentation "
                                  "setup settings options reference sample"))


def is_keyword_query(question: str) -> bool:
    """A search typed as keywords ("hostfile format", "zero_to_fp32 usage"): at most KEYWORD_WORDS words, no
    question mark, question word or person, no Chinese. None of our labelled questions is one."""
    return len(question.split()) <= KEYWORD_WORDS and not _ASKING.search(question) and not has_cjk(question)


# a terse question, as typed into a chat or a search box ("bf16 or fp16?", "zero3 怎么导出权重？"): at most
# TERSE_WORDS words, or TERSE_CJK_CHARS characters when it holds Chinese. The coverage decision keeps its own
# threshold for them (`coverage_group`): of 94 terse answerable tune questions the one threshold refused 34
TERSE_WORDS, TERSE_CJK_CHARS = 7, 20
TERSE = "terse"


def coverage_group(question: str) -> str:
    """The group whose threshold the coverage decision applies: TERSE, or "" (every other question)."""
    text = question.strip()
    terse = len(text) <= TERSE_CJK_CHARS if has_cjk(text) else len(text.split()) <= TERSE_WORDS
    return TERSE if terse else ""


def titles_in(question: str, titles: Iterable[str]) -> list[str]:
    """The page titles a question names as a phrase ("How do I enable Domino?" names the page "Domino")."""
    low = question.lower()  # a plain substring test first: a pattern per title only for the few that pass it
    named = [t for t in titles if t.lower() in low and re.search(rf"(?<!\w){re.escape(t.lower())}(?!\w)", low)]
    # the longest name only: "ZeRO-Offload" names that page, not also the one titled "ZeRO"
    return [t for t in named if not any(t != o and t.lower() in o.lower() for o in named)]


@dataclass(frozen=True)
class QuestionParts:
    ask: str  # the sentences that ask (or quote the error); the whole question when nothing stands out
    context: str  # everything else ("" for a one-sentence question)

    @property
    def has_context(self) -> bool:
        return bool(self.context.strip())


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END.split(text) if s and s.strip()]


def _is_ask(sentence: str) -> bool:
    s = sentence.strip().strip("\"'`*-> ")
    return s.endswith(("?", "？")) or bool(_ASK_EN.match(s)) or bool(_ASK_ZH.search(s)) or bool(_ERROR.search(s))


def split_question(question: str) -> QuestionParts:
    """The ask and its context. One-sentence questions, and ones where every sentence asks or none
    does, are all ask. A config block written inside the ask ("With {"zero_optimization": ...} how do I
    save the weights?") is context: its keys would outweigh the few words that ask (`config_blocks`)."""
    parts = sentences(question)
    flags = [_is_ask(s) for s in parts]
    if len(parts) <= 1 or all(flags) or not any(flags):
        ask, context = question.strip(), ""
    else:
        ask = " ".join(s for s, f in zip(parts, flags, strict=True) if f)
        context = " ".join(s for s, f in zip(parts, flags, strict=True) if not f)
    blocks = config_blocks(ask)
    if blocks:
        rest = _cut(ask, blocks)
        if len(rest) >= MIN_ASK_CHARS:  # a block with "why?" after it stays the ask: the block is what is asked about
            return QuestionParts(ask=rest, context=" ".join([context, *(ask[s:e] for s, e in blocks)]).strip())
    return QuestionParts(ask=ask, context=context)


MIN_ASK_CHARS = 12  # what is left of an ask without its config blocks, for the blocks to go to the context
_BLOCK_KEY = re.compile(r"""["'][A-Za-z_][\w.-]*["']\s*:""")  # a quoted key and its colon: JSON or a Python dict


def config_blocks(text: str) -> list[tuple[int, int]]:
    """The (start, end) of each outermost brace block that writes quoted keys (a JSON config or a Python
    dict), in order; an unclosed block runs to the end of the text."""
    spans: list[tuple[int, int]] = []
    at = text.find("{")
    while at != -1:
        end = block_end(text, at)
        spans.append((at, len(text) if end is None else end))
        at = -1 if end is None else text.find("{", end)
    return [(s, e) for s, e in spans if _BLOCK_KEY.search(text, s, e)]


def without_config_blocks(text: str) -> str:
    """The text with each config block (`config_blocks`) cut out: what a question asks and says in words."""
    blocks = config_blocks(text)
    return _cut(text, blocks) if blocks else text


def _cut(text: str, blocks: list[tuple[int, int]]) -> str:
    """`text` without the spans `blocks` (in order), its spaces collapsed."""
    pieces, at = [], 0
    for start, end in blocks:
        pieces.append(text[at:start])
        at = end
    return " ".join("".join([*pieces, text[at:]]).split())


def block_end(text: str, start: int) -> int | None:
    """Where the brace block opening at `start` ends (just after its closing brace; braces inside quoted
    strings do not count), or None when the text ends first."""
    depth, quote = 0, ""
    for end in range(start, len(text)):
        ch = text[end]
        if quote:
            quote = "" if ch == quote and text[end - 1] != "\\" else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return end + 1
    return None


_SETTING = re.compile(r'"([A-Za-z_][\w-]*)"\s*:|(?<![\w-])--([A-Za-z][\w-]*)|[(,]\s*([A-Za-z_]\w*)\s*=(?!=)')


def settings_named(text: str) -> list[str]:
    """The settings a text writes out in config, command-line or call form: JSON keys (`"overlap_comm":
    true`), flags (`--num_gpus`) and keyword arguments (`init_inference(model, tp_size=2)`), lowercased;
    only compound names (with `_` or `-`): a one-word flag such as `--include` is a common word too.
    (Keyword arguments joined at this stop: 4 more of tune's 210 unanswerable questions write out one
    that nothing indexed names, none of its 374 answerable ones.)"""
    names = [a or b or c for a, b, c in _SETTING.findall(text)]
    return [n.lower() for n in names if "_" in n or "-" in n]


_CALL = re.compile(r"(?<![\w.])((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*)\(([^()]*(?:\([^()]*\)[^()]*)*)\)")
_INNER = re.compile(r"\([^()]*\)")
_KEYWORD = re.compile(r"(?:^|,)\s*([A-Za-z_]\w*)\s*=(?!=)")


def keyword_calls(text: str) -> list[tuple[str, str]]:
    """(callee as written, keyword) for every keyword argument a text passes in call form:
    `deepspeed.initialize(..., seed=1234)` gives ("deepspeed.initialize", "seed"); the keywords of a call
    nested in the arguments belong to that call only."""
    out: list[tuple[str, str]] = []
    for m in _CALL.finditer(text):
        out += [(m.group(1), k) for k in _KEYWORD.findall(_INNER.sub("()", m.group(2)))]
        out += keyword_calls(m.group(2))  # the calls inside its arguments
    return out


def identifiers(text: str) -> set[str]:
    """The whole identifiers a text names (`overlap_comm`, `deepspeed.zero.init`, `--num_gpus`),
    lowercased: the tokens with `_` or `.` that the tokenizer keeps whole, not the segments it also gives of
    a dotted name (`overlap_comm` of `zero_optimization.overlap_comm`: the text names the path, not the key alone)."""
    found = {t for t in tokenize(text, expand=False) if "_" in t or "." in t}
    segments = {s for t in found if "." in t for s in t.split(".")}
    return {t for t in found if "." in t or t not in segments}
