"""GSM8K scorer: what is attached to a number and changes its value is read with it (a mixed number as one improper
fraction), or the answer is none; never a part of the value (the same kind of fault as case P03). Found by trying
it: ``#### 7\\frac{1}{2}`` scored as 7, ``#### 2³`` as 2, ``#### 1_000`` as 1, ``#### 3\\sqrt{2}`` as 3, flexible
``3 1/2 cups`` as 1/2 and ``2\\frac34`` as 34; strict ``#### **42**`` was no answer."""
import time

import pytest

from rewards.gsm8k import compute_score, extract_solution, judge


@pytest.mark.parametrize("text,value,whole", [
    ("#### 7\\frac{1}{2}", "7.5", "7"), ("#### 7 \\frac{1}{2}", "7.5", "7"), ("#### 3\\tfrac{1}{2} cups", "3.5", "3"),
    ("#### 2\\frac34", "2.75", "2"), ("#### 2\\dfrac{3}{4}.", "2.75", "2"), ("#### 3 1/2", "3.5", "3"),
    ("#### 3 1/2 cups", "3.5", "3"), ("#### -3 1/2", "-3.5", "-3"), ("#### $3 1/2", "3.5", "3"),
    ("#### 1,000 1/2", "1000.5", "1000"), ("#### 3½", "3.5", "3"), ("#### 5 ⅞ cups", "5.875", "5"),
    ("#### 1⁄2", "0.5", "1"),
])
def test_p03_value_changing_tail_is_read_whole_by_strict(text, value, whole):
    assert compute_score(text, value) == 1.0, extract_solution(text)
    assert compute_score(text, whole) == 0.0, extract_solution(text)  # never the whole part alone
    assert compute_score(text, value, method="flexible") == 1.0, extract_solution(text, "flexible")


@pytest.mark.parametrize("text,part", [
    ("#### 2³", "2"), ("#### 42²", "42"), ("#### 10⁻³", "10"), ("#### 2ⁿ", "2"), ("#### 2₁₀", "2"),
    ("#### 1_000", "1"), ("#### 2_{10}", "2"), ("#### 3\\sqrt{2}", "3"), ("#### 3\\sqrt2", "3"), ("#### 3√2", "3"),
    ("#### 3 √2", "3"), ("#### 2\\pi", "2"), ("#### 2 \\pi", "2"), ("#### 5π", "5"), ("#### 0.\\overline{3}", "0"),
    ("#### 0.3\u0305", "0.3"), ("#### 10 \\over 3", "10"), ("#### 3 \\choose 2", "3"), ("#### 2\\infty", "2"),
    ("#### 2{,}000", "2"), ("#### 2\\,000", "2"), ("#### 1\u00a0000", "1"), ("#### 1\u202f000", "1"),
    ("#### 5′3″", "5"), ("#### 5! = 120", "5"), ("#### 5!/3!", "5"), ("#### 5!! = 15", "5"),
    ("#### 7\\frac{5}{4}", "7"), ("#### 7\\frac{1}{2x}", "7"), ("#### 7\\frac{x}{2}", "7"),
    ("#### 3\\frac{1}{2}\\pi", "3.5"), ("#### 10 - \\frac{1}{2}", "10"), ("#### 10 - √2", "10"),
])
def test_p03_value_changing_tail_that_cannot_be_read_is_no_answer(text, part):
    assert extract_solution(text) is None
    assert compute_score(text, part, format_score=0.1) == 0.0  # no answer, not a wrong one
    assert judge(text, part) == (False, False)


@pytest.mark.parametrize("text,expected", [
    ("The answer is 3 1/2 cups.", "7/2"), ("so -3 1/2", "-7/2"), ("#### 7\\frac{1}{2}", "15/2"),
    ("so 7 \\frac{1}{2}", "15/2"), ("\\boxed{7\\frac{1}{2}}", "15/2"), ("#### 2\\frac34", "11/4"),
    ("so \\frac34", "3/4"), ("so \\frac 3 4", "3/4"), ("so 3½", "7/2"), ("so 3 ½ cups", "7/2"), ("so ½", "1/2"),
    ("so 1⁄2", "1/2"),
])
def test_p03_flexible_reads_a_mixed_number_or_latex_fraction_whole(text, expected):
    assert extract_solution(text, "flexible") == expected


@pytest.mark.parametrize("text", [
    "so 2³", "so 10⁻³", "so 1_000", "so x_{10}", "so 3√2", "so √2", "so \\sqrt2", "so \\sqrt[3]{8}", "so 2\\pi",
    "so 0.\\overline{3}", "so 10 \\over 3", "so 2{,}000", "so 2\\,000", "so 1\u00a0000", "so 5′3", "so 5!/3!",
    "3 5/4", "2.5 1/2", "1/2 3/4", "10 - 3 1/2", "7 - \\frac{1}{2}", "7-\\frac{1}{2}", "2^\\frac{1}{2}",
    "\\frac{1}{2}\\pi", "so \\frac345", "so \\frac{3}4", "so \\frac3{4}", "10 - ½", "3 \\frac{-1}{2}",
])
def test_p03_flexible_never_reads_a_part_of_the_last_value(text):
    assert extract_solution(text, "flexible") is None


def test_p03_a_mixed_number_is_a_whole_number_and_a_proper_fraction():
    """Read: a whole number, then a proper fraction of whole numbers; anything else after the whole number is no
    answer (never the whole number, nor the fraction alone), and a mixed number is read as a number: nothing more
    may be attached to it."""
    assert extract_solution("#### 3 1/2") == "7/2" and extract_solution("3 1/2", "flexible") == "7/2"
    for text in ("3 5/4", "3 0/4", "2.5 1/2", "3 1.5/2", "3 1/2/4", "3 1/2 + 1", "3 1/2^2", "5½²", "1 000 1/2",
                 "7\\frac{1}{2}3"):
        assert extract_solution("#### " + text) is None, text
        assert extract_solution("so " + text, "flexible") is None, text
    for text, expected in (("x = -\\frac{1}{2}", "-1/2"), ("Step 2: 1/2", "1/2"), ("so \\frac{-3}{4}", "-3/4"),
                           ("\\boxed{\\frac{1}{2}}", "1/2")):  # no whole number before the fraction
        assert extract_solution(text, "flexible") == expected, text


@pytest.mark.parametrize("text,gt", [
    ("#### **42**", "42"), ("#### ** 42 **", "42"), ("#### *42*", "42"), ("#### __42__", "42"),
    ("#### **-$42**", "-42"), ("#### **3 1/2**", "3.5"),
])
def test_p03_strict_reads_markdown_emphasis_after_the_marker(text, gt):
    assert compute_score(text, gt) == 1.0, extract_solution(text)
    assert compute_score(text, gt, method="flexible") == 1.0, extract_solution(text, "flexible")


def test_p03_a_ground_truth_from_a_float32_column_is_the_decimal_written():
    np = pytest.importorskip("numpy")
    for written in ("0.1", "2.3", "0.35", "123456.7", "-2.5", "12.5"):
        stored = np.float32(written)  # a parquet float32 column reads back as float(stored): 0.10000000149011612
        for truth in (stored, float(stored)):
            assert compute_score(f"#### {written}", truth) == 1.0, (written, truth)
    assert compute_score("#### 0.1", np.float16(0.1)) == 1.0
    # a float64 value keeps its own repr: 0.1 is 0.1, and the float32 neighbour of 0.1 is not written as float64
    assert compute_score("#### 0.1", 0.1) == 1.0 and compute_score("#### 0.1", 0.1000000001) == 0.0
    assert compute_score("#### 0.10000000149011612", float(np.float32(0.1))) == 0.0


def test_p03_no_break_spaces_after_the_marker_are_spaces():
    for text in ("####\u00a042", "#### \u00a042", "####\u202f42", "#### \u00a0**42**"):
        assert compute_score(text, "42") == 1.0, repr(text)
    assert compute_score("#### -\u00a0$\u00a042", "-42") == 1.0
    assert extract_solution("#### 1\u00a0000") is None  # digit groups joined by a no-break space stay no answer


def test_p03_a_bold_numbered_heading_after_the_marker_is_no_answer():
    for text in ("#### **1. Find the total cost**", "#### **2) Add the two**", "#### __1. Find__",
                 "#### ** 3. Check the units**", "#### **1: Find the cost**", "#### **7.\u00a0Find**"):
        assert extract_solution(text) is None, text
        assert compute_score(text + "\nThe total is 1 dollar.", "1") == 0.0, text
    # an earlier answer marker is kept when a heading comes after it; emphasis closed after the number is an answer
    assert extract_solution("#### 42\n#### **2. Check the answer**") == "42"
    for text in ("#### **42.**", "#### **42.** Done", "#### **1.5 kg**", "#### 1. Find"):
        assert extract_solution(text) in ("42", "1.5", "1"), text
    # a bold label then words is never read, whatever the words: the label is not the answer
    for text, label in (("#### **3. Final Answer: 42**", "3"), ("#### **1. The answer is seventy-two.**", "1"),
                        ("#### **42. That is the answer.**", "42"), ("#### **72. She paid $72.**", "72")):
        assert extract_solution(text) is None and compute_score(text, label) == 0.0, text
    assert compute_score("#### **42!** Done", "42") == 1.0

    for _ in range(2):  # linear on a long run of headings
        assert extract_solution("#### **1. Find**\n" * 100_000) is None


def test_p03_units_percent_and_sentence_ends_stay_outside_the_number():
    for text in ("#### 42 km", "#### 42km", "#### 42 \\text{ km}", "#### 42\\,\\text{km}", "#### 42%", "#### 42\\%",
                 "#### 42.", "#### 42!", "#### 42!!", "#### 42!!!", "#### 42! (wow)", "#### 42°", "#### 42\u00a0km",
                 "#### 42 x", "#### 42's",
                 "#### 42 - that is it", "#### 42 **bold**"):
        assert compute_score(text, "42") == 1.0, (text, extract_solution(text))
        assert compute_score("so " + text[5:], "42", method="flexible") == 1.0, text
    assert compute_score("#### **42**", "42") == 1.0  # and emphasis: what was missing


@pytest.mark.parametrize("text,gt,strict,flexible", [
    ("#### 1" + " " * 1_000_000 + "1/2", "1.5", 1.0, 1.0), ("½" * 1_000_000, "0.5", 0.0, 1.0),
    (" " * 1_000_000 + "3 ½", "3.5", 0.0, 1.0), ("#### **" * 150_000 + "42**", "42", 1.0, 1.0),
    ("#### 5" + "!" * 1_000_000, "5", 1.0, 1.0), ("#### 5" + "!" * 1_000_000 + "/3", "5", 0.0, 0.0), ("\\sqrt[3]{" * 100_000 + "8}", "8", 0.0, 0.0),
    ("7" + " " * 1_000_000 + "\\frac{1}{2}", "7.5", 0.0, 1.0), ("#### 7" + " \\dfrac" * 140_000, "7", 0.0, 0.0),
    ("#### 2" + "\u0305" * 1_000_000, "2", 0.0, 0.0), ("1_" * 500_000, "1", 0.0, 0.0), ("2³" * 500_000, "2", 0.0, 0.0),
    ("#### 1" + "\u00a0" * 1_000_000 + "000", "1", 0.0, 0.0), ("3\\frac12" * 125_000, "12", 0.0, 0.0),
])
def test_p03_attachment_scans_stay_linear(text, gt, strict, flexible):
    t0 = time.process_time()  # CPU time: the scorer's own cost, whatever else shares the cores
    assert (compute_score(text, gt), compute_score(text, gt, method="flexible")) == (strict, flexible)
    assert time.process_time() - t0 < 1.0
