"""The web UI's files (app/ui/static, docs/ui.md): one dictionary per language with the same
keys, every label the code names in both, no HTML parsing of strings, no inline script or
style, and every file covered by the package data the wheel is built from."""

from __future__ import annotations

import fnmatch
import json
import re
import tomllib
from pathlib import Path

from tests.browser import ZH_AS_IS_WORDS

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "app" / "ui" / "static"
LANGS = ("en", "zh-CN")
_LABEL = re.compile(r"\bt\('([A-Za-z0-9_.-]+)'")
_PLACEHOLDER = re.compile(r"\{(\w+)\}")
_CJK = re.compile(r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]")
_WORD = re.compile(r"[A-Za-z][A-Za-z_:]+")
# Ways a string could become markup or code.
_UNSAFE_JS = re.compile(
    r"\.innerHTML\b|\.outerHTML\b|insertAdjacentHTML|document\.write|\beval\(|new Function\("
    r"|\.srcdoc\b|createContextualFragment|setAttribute\(\s*'on"
)


def _dict(lang: str) -> dict[str, str]:
    data: dict[str, str] = json.loads((STATIC / "i18n" / f"{lang}.json").read_text("utf-8"))
    return data


def _scripts() -> list[Path]:
    return sorted(STATIC.rglob("*.js"))


def test_both_dictionaries_have_the_same_keys_and_placeholders() -> None:
    en, zh = _dict("en"), _dict("zh-CN")
    assert set(en) == set(zh), {
        "only in en": sorted(set(en) - set(zh)),
        "only in zh-CN": sorted(set(zh) - set(en)),
    }
    for key in en:
        assert en[key].strip() and zh[key].strip(), key
        assert set(_PLACEHOLDER.findall(en[key])) == set(_PLACEHOLDER.findall(zh[key])), key


def test_every_zh_cn_label_is_chinese() -> None:
    zh = {k: _PLACEHOLDER.sub("", v) for k, v in _dict("zh-CN").items()}
    untranslated = {k: v for k, v in zh.items() if not _CJK.search(v) and v != "UTC"}
    assert not untranslated, untranslated
    latin = {k: w for k, v in zh.items() for w in _WORD.findall(v) if w not in ZH_AS_IS_WORDS}
    assert not latin, f"Latin words in zh-CN labels (tests/browser.py ZH_AS_IS_WORDS): {latin}"


def test_zh_cn_has_one_word_for_a_revision_and_another_for_the_service_version() -> None:
    """A task's revision is "版本" everywhere (not also "修订"); the System page's version of
    the server is "服务版本", so "版本" alone never means two things."""
    zh = _dict("zh-CN")
    assert not {k: v for k, v in zh.items() if "修订" in v}
    assert zh["system.version"] == "服务版本"
    assert zh["run.revision"] == zh["tasks.revisions"] == "版本"


def test_zh_cn_reads_as_chinese_not_word_for_word_english() -> None:
    """A schedule's decisions are its "调度记录" (not "决定历史", a decision history word for
    word), and no button says "为它" (for it) or "其运行" (its runs) as English would."""
    zh = _dict("zh-CN")
    assert zh["schedules.decisions"] == "调度记录"
    calques = ("决定", "为它", "查看其")
    assert not {k: v for k, v in zh.items() if any(c in v for c in calques)}
    # "保留" is retention on every page: the disk's reserve is "预留", or the System page would
    # list "保留空间" (space retention keeps) beside "保留的日志" (logs retention keeps).
    assert zh["storage.reserve_bytes"] == "预留空间"
    assert zh["storage.finished_expiring"] != "完成的中断过期"  # "finished interrupted expiry"
    # In English too: "Interrupted expiries finished" was the code's name, not a reader's.
    assert "expir" not in _dict("en")["storage.finished_expiring"].lower()


def test_every_label_the_code_names_is_in_the_dictionary() -> None:
    en = _dict("en")
    used = {key for path in _scripts() for key in _LABEL.findall(path.read_text("utf-8"))}
    assert used, "the scan found no t('...') call"
    assert not used - set(en), sorted(used - set(en))


def test_no_script_turns_a_string_into_markup() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in _scripts()
        for n, line in enumerate(path.read_text("utf-8").splitlines(), 1)
        if _UNSAFE_JS.search(line) and not line.lstrip().startswith("//")
    ]
    assert not found, "\n".join(found)


def test_the_page_has_no_inline_script_style_or_handler() -> None:
    html = (STATIC / "index.html").read_text("utf-8")
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html), "inline <script>"
    assert "<style" not in html and not re.search(r"\sstyle=", html)
    assert not re.search(r"\son[a-z]+=", html), "inline event handler"
    assert not re.search(r"(src|href)=\"(https?:)?//", html), "a resource from another origin"


def test_every_static_file_is_package_data() -> None:
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["tool"]["setuptools"][
        "package-data"
    ]["app"]
    files = [p.relative_to(ROOT / "app").as_posix() for p in STATIC.rglob("*") if p.is_file()]
    # setuptools globs: "*" does not cross "/", so match segment by segment.
    missing = [
        f
        for f in files
        if not any(
            len(f.split("/")) == len(p.split("/"))
            and all(
                fnmatch.fnmatchcase(a, b) for a, b in zip(f.split("/"), p.split("/"), strict=True)
            )
            for p in patterns
        )
    ]
    assert not missing, f"not in [tool.setuptools.package-data] app: {missing}"


def test_every_event_type_the_service_records_has_a_label_in_each_language() -> None:
    from app.domain.events import ALL_EVENT_TYPES

    for lang in LANGS:
        labels = _dict(lang)
        missing = sorted(t for t in ALL_EVENT_TYPES if f"event.{t}" not in labels)
        assert missing == [], (lang, missing)


_HEX_VAR = re.compile(r"(--[\w-]+):\s*(#[0-9a-fA-F]{6})\b")


def _contrast(a: str, b: str) -> float:
    """WCAG 2 contrast ratio of two #rrggbb colours."""

    def luminance(colour: str) -> float:
        if len(colour) == 4:  # #rgb
            colour = "#" + "".join(c * 2 for c in colour[1:])
        rgb = [int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
        lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_every_text_colour_on_its_background_meets_wcag_aa_in_both_schemes() -> None:
    """The page's text, help and link colours on the page and on a card, and every rule of
    app.css that sets a text colour on a background of its own (buttons, badges, notices),
    reach 4.5:1 in the light scheme and in the dark one (a danger button's white text on the
    dark scheme's light red was 2:1)."""
    css = (STATIC / "app.css").read_text("utf-8")
    dark_at = css.index("@media (prefers-color-scheme: dark)")
    light = dict(_HEX_VAR.findall(css[css.index(":root") : dark_at]))
    dark = {**light, **dict(_HEX_VAR.findall(css[dark_at : css.index("}", dark_at)]))}
    pairs = {
        (f"var(--{f})", f"var(--{b})") for f in ("fg", "muted", "accent") for b in ("bg", "card")
    }
    for rule in re.finditer(r"([^{}]*)\{([^{}]*)\}", css):
        decls = dict(re.findall(r"(?:^|;)\s*(color|background)\s*:\s*([^;]+)", rule.group(2)))
        if "color" in decls and "background" in decls and "transparent" not in decls["background"]:
            pairs.add((decls["color"].strip(), decls["background"].strip()))
    assert len(pairs) > 10, pairs
    low = []
    for scheme, colours in (("light", light), ("dark", dark)):
        for fg, bg in sorted(pairs):
            ratio = _contrast(*(colours[v[4:-1]] if v.startswith("var(") else v for v in (fg, bg)))
            if ratio < 4.5:
                low.append(f"{scheme}: {fg} on {bg} is {ratio:.2f}:1")
    assert not low, low
