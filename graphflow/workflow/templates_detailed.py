"""Detailed operation templates (written for GraphFlow): instructions, the expected output
format and two short worked examples per operation, 250–800 tokens of SmolLM2's tokenizer.

Real agent workflows carry prompts of this size per operation; reusing their KV after a new
prefix is what differential KV is for (``experiments/kv_memory``). Like the short templates,
none contains the task: the task context is the shared root every node forks.
"""

from __future__ import annotations

__all__ = ["DETAILED_TEMPLATES"]


def _detailed(title: str, instructions: str, output: str, first: str, second: str, close: str) -> str:
    return (
        f"\n### Step: {title}\n{instructions}\n\n"
        f"Output format:\n{output}\n\n"
        f"Worked example 1.\n{first}\n\n"
        f"Worked example 2.\n{second}\n\n"
        f"{close}\n"
    )


DETAILED_TEMPLATES: dict[str, str] = {
    "SOLVE": _detailed(
        "solve",
        "You are the solver in a team of agents. Read the problem above carefully and solve it one "
        "step at a time. Before you compute anything, write down which quantities the problem gives "
        "and which quantity it asks for. Then take one small step per line: say what you compute, "
        "write the arithmetic, and give the result with its unit. Keep every number you use traceable "
        "to the problem text or to an earlier line. Do not skip steps that change units (minutes to "
        "hours, cents to dollars, dozens to items). If the problem is ambiguous, say which reading you "
        "take and why, then continue with that reading. Never guess a number the problem does not give.",
        "Given: one line listing the known quantities.\n"
        "Goal: one line naming the unknown.\n"
        "Steps: numbered lines, one computation each.\n"
        "Final answer: <number or short phrase>, on its own last line.",
        "Problem: A library lends 14 books on Monday and twice as many on Tuesday. How many books does "
        "it lend on the two days together?\n"
        "Given: Monday 14 books; Tuesday is twice Monday.\n"
        "Goal: books lent on both days.\n"
        "Steps:\n1. Tuesday: 2 × 14 = 28 books.\n2. Both days: 14 + 28 = 42 books.\n"
        "Final answer: 42",
        "Problem: A pump fills 3 liters every 4 minutes. How long does it take to fill a 45 liter tank?\n"
        "Given: 3 liters per 4 minutes; tank of 45 liters.\n"
        "Goal: time to fill the tank.\n"
        "Steps:\n1. Rate: 3 / 4 = 0.75 liters per minute.\n2. Time: 45 / 0.75 = 60 minutes.\n"
        "3. In hours: 60 minutes = 1 hour.\n"
        "Final answer: 60 minutes",
        "Now solve the problem above in exactly this format.",
    ),
    "SOLVE_ALT": _detailed(
        "solve another way",
        "You are the second solver in a team of agents, and your value to the team is independence. "
        "Solve the problem above with a different method than the most obvious one: work backwards "
        "from the goal, set up an equation with an unknown, count with a table, or check a smaller "
        "case and scale it. Name the method you chose in one line before you start. Show each step "
        "with its arithmetic and unit, as a careful student would on an exam. If your method and the "
        "obvious one would give different answers, trust the steps you can check, not the answer you "
        "expected. Do not copy another agent's reasoning; you have not seen it.",
        "Method: one line naming the approach.\n"
        "Steps: numbered lines, one computation each.\n"
        "Final answer: <number or short phrase>, on its own last line.",
        "Problem: After spending 18 dollars, Lena has one third of her money left. How much did she "
        "start with?\n"
        "Method: an equation with the unknown starting amount x.\n"
        "Steps:\n1. She spent two thirds of x, so (2/3) × x = 18.\n2. x = 18 × 3 / 2 = 27 dollars.\n"
        "3. Check: 27 − 18 = 9, and 9 is one third of 27.\n"
        "Final answer: 27",
        "Problem: A tiling has 5 tiles in the first row and each row has 2 more tiles than the row "
        "before. How many tiles are in the first 4 rows?\n"
        "Method: a table of rows.\n"
        "Steps:\n1. Rows: 5, 7, 9, 11.\n2. Sum: 5 + 7 + 9 + 11 = 32 tiles.\n"
        "Final answer: 32",
        "Now solve the problem above with a method of your own choosing, in this format.",
    ),
    "SOLVE_ASSUME": _detailed(
        "check assumptions",
        "You are the skeptic in a team of agents. Before solving the problem above, list what it "
        "takes for granted: quantities that stay constant, events that happen once or repeatedly, "
        "whether a rate applies to the whole period, whether items are shared or counted per person, "
        "and what happens at the boundaries (the first and last day, a partial hour). Check each "
        "assumption against the exact words of the problem and mark it as stated, implied or unsupported. "
        "Then solve the problem using only the assumptions that are stated or implied, one step per "
        "line, and give the final answer. If an unsupported assumption would change the answer, "
        "say so in one sentence after the final answer.",
        "Assumptions: numbered lines, each ending with (stated), (implied) or (unsupported).\n"
        "Steps: numbered lines, one computation each.\n"
        "Final answer: <number or short phrase>, on its own line.\n"
        "Caveat: one sentence, only if needed.",
        "Problem: A shop sells pens in packs of 6. Ari needs 20 pens. How many packs must he buy?\n"
        "Assumptions:\n1. Packs cannot be split (implied by 'packs of 6').\n"
        "2. Ari needs at least 20 pens, not exactly 20 (implied).\n"
        "Steps:\n1. 20 / 6 = 3.33 packs.\n2. Round up to whole packs: 4.\n"
        "Final answer: 4",
        "Problem: A runner trains 5 km a day for a week. How far does she run?\n"
        "Assumptions:\n1. A week means 7 days of training (unsupported; some plans rest one day).\n"
        "2. The distance is the same each day (stated).\n"
        "Steps:\n1. 7 × 5 = 35 km.\n"
        "Final answer: 35 km\n"
        "Caveat: with one rest day the answer would be 30 km.",
        "Now check the assumptions of the problem above and solve it, in this format.",
    ),
    "REVIEW": _detailed(
        "review",
        "You are the reviewer in a team of agents. The work above was written by another agent and may "
        "contain mistakes. Read it as a strict checker would: recompute every arithmetic step yourself, "
        "check that each number comes from the problem or from an earlier step, check units and "
        "rounding, and check that the final answer answers the question that was asked (not a "
        "quantity computed on the way). Quote the first wrong line exactly if there is one. Do not "
        "rewrite correct work and do not praise it. If everything is right, say so plainly. Whether "
        "or not you found an error, end with the final answer you believe is correct.",
        "Verdict: correct | incorrect\n"
        "Error: the first wrong line, quoted, and what is wrong with it (or 'none').\n"
        "Fix: the corrected steps from that line on (or 'none').\n"
        "Final answer: <number or short phrase>",
        "Work under review: '1. Each box holds 12 eggs. 2. 5 boxes hold 5 + 12 = 17 eggs. Final answer: 17'\n"
        "Verdict: incorrect\n"
        "Error: '2. 5 boxes hold 5 + 12 = 17 eggs' adds where it should multiply.\n"
        "Fix: 2. 5 boxes hold 5 × 12 = 60 eggs.\n"
        "Final answer: 60",
        "Work under review: '1. The train covers 240 km in 3 hours. 2. Speed: 240 / 3 = 80 km per hour. "
        "Final answer: 80 km per hour'\n"
        "Verdict: correct\n"
        "Error: none\n"
        "Fix: none\n"
        "Final answer: 80 km per hour",
        "Now review the work above in exactly this format.",
    ),
    "REFINE": _detailed(
        "refine",
        "You are the editor in a team of agents. Above are a solution and feedback on it from a "
        "reviewer. Use the feedback to produce an improved solution: fix every error the feedback "
        "names, recheck the steps that depend on a fixed step, and keep every step the feedback did "
        "not question unless you find it wrong yourself. If the feedback is itself mistaken, keep the "
        "original step and add a short note saying why. Return only the improved solution, complete "
        "from the first step to the final answer, so a reader needs nothing else to follow it. Do not "
        "mention the reviewer or describe your edits beyond the notes.",
        "Steps: numbered lines, one computation each, corrected.\n"
        "Notes: lines starting with 'Note:' only where you disagreed with the feedback.\n"
        "Final answer: <number or short phrase>",
        "Solution: '1. 3 shirts at 8 dollars cost 3 × 8 = 24. 2. With a 5 dollar coupon: 24 + 5 = 29.' "
        "Feedback: 'Step 2 adds the coupon; it should be subtracted.'\n"
        "Steps:\n1. 3 shirts at 8 dollars cost 3 × 8 = 24 dollars.\n"
        "2. With a 5 dollar coupon: 24 − 5 = 19 dollars.\n"
        "Final answer: 19",
        "Solution: '1. Half of 50 students is 25. 2. 25 students walk.' "
        "Feedback: 'Half of 50 is 20.'\n"
        "Steps:\n1. Half of 50 students is 50 / 2 = 25.\n2. 25 students walk.\n"
        "Note: the feedback is mistaken; 50 / 2 = 25.\n"
        "Final answer: 25",
        "Now write the improved solution for the work and feedback above, in this format.",
    ),
    "ENSEMBLE": _detailed(
        "pick the consensus",
        "You are the judge in a team of agents. Several candidate solutions to the problem above are "
        "listed, each written by a different agent. Extract the final answer of every candidate and "
        "normalize it (same unit, no trailing zeros, fractions as decimals where the problem uses "
        "decimals). Group candidates whose normalized answers are equal and count each group. Choose "
        "the answer of the largest group. If two groups tie, read the reasoning of each tied group and "
        "pick the one whose steps are correct; if you cannot tell, pick the answer that appeared first. "
        "Restate the chosen answer exactly once at the end. Do not solve the problem again from scratch.",
        "Answers: one line per candidate, 'candidate id: answer'.\n"
        "Groups: one line per distinct answer with its count.\n"
        "Chosen: the answer and why (majority, or how a tie was broken).\n"
        "Final answer: <number or short phrase>",
        "Candidates: [n1] '... Final answer: 42' [n2] '... Final answer: 42.0' [n3] '... Final answer: 36'\n"
        "Answers:\nn1: 42\nn2: 42\nn3: 36\n"
        "Groups:\n42: 2\n36: 1\n"
        "Chosen: 42, the majority.\n"
        "Final answer: 42",
        "Candidates: [n1] '... 3 × 4 = 12. Final answer: 12' [n2] '... 3 + 4 = 7. Final answer: 7'\n"
        "Answers:\nn1: 12\nn2: 7\n"
        "Groups:\n12: 1\n7: 1\n"
        "Chosen: 12; a tie, and n1 multiplies where the problem asks for a product.\n"
        "Final answer: 12",
        "Now judge the candidate solutions above in this format.",
    ),
    "PROGRAM": _detailed(
        "program",
        "You are the programmer in a team of agents. Write a Python function named solve() that "
        "takes no arguments and returns the answer to the problem above as a number. Translate each "
        "quantity of the problem into a named variable with a comment giving its unit, then compute "
        "the answer in small, readable steps. Use only the standard library; do not read input, print, "
        "or import anything you do not use. Use integer arithmetic where the problem counts whole "
        "things and exact fractions where it divides. The code will be executed, and its return value "
        "compared with the other agents' answers, so it must run as written.",
        "A single fenced Python code block that defines solve(); no text before or after it.",
        "Problem: A farmer has 7 rows of 9 apple trees and sells the apples of 15 trees. How many "
        "trees' apples remain?\n"
        "```python\n"
        "def solve():\n"
        "    rows = 7  # rows of trees\n"
        "    per_row = 9  # trees per row\n"
        "    sold = 15  # trees whose apples were sold\n"
        "    return rows * per_row - sold\n"
        "```",
        "Problem: Three friends split a 54 dollar bill equally and each adds a 2 dollar tip. What does "
        "each pay?\n"
        "```python\n"
        "def solve():\n"
        "    bill = 54  # dollars\n"
        "    friends = 3\n"
        "    tip = 2  # dollars per friend\n"
        "    return bill / friends + tip\n"
        "```",
        "Now write solve() for the problem above, as one code block.",
    ),
    "CODE": _detailed(
        "write code",
        "You are the coding agent in a team of agents. Write the Python function the problem above "
        "asks for, with the exact name and parameters it specifies. Read the examples in the problem "
        "as a specification: the function must return those outputs for those inputs. Handle the edge "
        "cases a careful engineer would expect (an empty list, zero, a single element, negative "
        "numbers) unless the problem rules them out. Prefer clear loops and built-ins over clever "
        "one-liners, and keep the function free of side effects: no printing, no input, no global "
        "state. Helper functions are fine when they are defined in the same block.",
        "A single fenced Python code block with the function (and any helpers); no text before or after it.",
        "Problem: Write a function count_vowels(s) that returns how many vowels the string s contains.\n"
        "```python\n"
        "def count_vowels(s):\n"
        "    vowels = set('aeiouAEIOU')\n"
        "    return sum(1 for ch in s if ch in vowels)\n"
        "```",
        "Problem: Write a function second_largest(xs) that returns the second largest distinct value "
        "in a list, or None if there is none.\n"
        "```python\n"
        "def second_largest(xs):\n"
        "    distinct = sorted(set(xs), reverse=True)\n"
        "    return distinct[1] if len(distinct) > 1 else None\n"
        "```",
        "Now write the function the problem above asks for, as one code block.",
    ),
    "TEST": _detailed(
        "test",
        "You are the tester in a team of agents. Above is code written by another agent for the problem "
        "above. Run it, in your head and step by step, against every example the problem gives, and "
        "against two edge cases of your own choosing (for example an empty input or the smallest "
        "allowed value). For each case write the input, the expected output and the output the code "
        "produces. If any case fails, explain the cause in one sentence and write a repaired version of "
        "the whole function; if every case passes, say so and repeat the code unchanged. Never change "
        "the function's name or parameters.",
        "Cases: one line per case, 'input -> expected | got | pass or FAIL'.\n"
        "Cause: one sentence, or 'all cases pass'.\n"
        "Code: one fenced Python code block with the repaired (or unchanged) function.",
        "Code under test: 'def is_even(n): return n % 2 == 1'\n"
        "Cases:\nis_even(4) -> True | False | FAIL\nis_even(7) -> False | True | FAIL\n"
        "is_even(0) -> True | False | FAIL\n"
        "Cause: the comparison tests for odd numbers.\n"
        "Code:\n```python\ndef is_even(n):\n    return n % 2 == 0\n```",
        "Code under test: 'def total(xs): return sum(xs)'\n"
        "Cases:\ntotal([1, 2, 3]) -> 6 | 6 | pass\ntotal([]) -> 0 | 0 | pass\n"
        "total([-2, 2]) -> 0 | 0 | pass\n"
        "Cause: all cases pass\n"
        "Code:\n```python\ndef total(xs):\n    return sum(xs)\n```",
        "Now test the code above in this format.",
    ),
    "ANSWER": _detailed(
        "answer",
        "You are the quick answerer in a team of agents, used when a short reply is worth more than a "
        "long derivation. Think briefly about the problem above: identify what is asked, do the "
        "essential computation in your head or in at most two short lines, and give the final answer "
        "only. Do not restate the problem, do not explain your method at length, and do not hedge "
        "between several answers. If the question asks for a unit, include it; if it asks for a whole "
        "number, give a whole number. If you cannot determine the answer, reply with 'unknown' rather "
        "than a guess.",
        "Work: at most two short lines (optional).\nFinal answer: <number or short phrase>",
        "Problem: A bag has 8 red and 12 blue marbles. What fraction of the marbles is red?\n"
        "Work: 8 / 20 = 2/5.\n"
        "Final answer: 2/5",
        "Problem: What is the perimeter of a square with sides of 7 cm?\nWork: 4 × 7 = 28.\nFinal answer: 28 cm",
        "Now answer the problem above in this format.",
    ),
    "FORMAT": _detailed(
        "format",
        "You are the formatter in a team of agents; you run last. Above is the final answer another "
        "agent produced, possibly inside a long explanation. Rewrite that answer in the exact short "
        "form the question expects: a bare number for a count or an amount (no units unless the "
        "question asks for them, no thousands separators, no trailing period), a fraction or decimal "
        "in the form the question uses, a yes or no for a yes-or-no question, or the exact word the "
        "question asks for. Do not change the value of the answer, even if you believe it is wrong; "
        "your job is the form, not the content. If the text above holds several candidate answers, format "
        "the one marked as final; if none is marked, format the last one.",
        "One line: the answer in its short form, and nothing else.",
        "Answer to format: 'So in total the school needs 1,250 chairs.'\n1250",
        "Answer to format: 'The final answer is that yes, she can afford the bike, with $3 to spare.' "
        "Question asked: 'Can she afford the bike?'\nyes",
        "Now format the answer above.",
    ),
    "PATCH": _detailed(
        "patch",
        "You are the patching agent in a team of agents. The issue above describes a bug in a code base. "
        "Write a unified diff that fixes it with the smallest change that is still correct: locate the "
        "function the issue points at, fix the cause rather than the symptom, and leave formatting, "
        "names and unrelated code untouched. Include enough context lines for the patch to apply "
        "cleanly, use the repository-relative path in the headers, and keep hunks in file order. If "
        "the fix needs a new test, add it in the same diff. Do not explain the patch outside the diff.",
        "A single fenced diff block in unified format (--- a/path, +++ b/path, @@ hunks).",
        "Issue: 'clamp(x, lo, hi) returns hi when x equals lo.'\n"
        "```diff\n"
        "--- a/util/numbers.py\n"
        "+++ b/util/numbers.py\n"
        "@@ -3,4 +3,4 @@ def clamp(x, lo, hi):\n"
        "-    if x <= lo:\n"
        "-        return hi\n"
        "+    if x <= lo:\n"
        "+        return lo\n"
        "     return min(x, hi)\n"
        "```",
        "Issue: 'greet(name) crashes on an empty name.'\n"
        "```diff\n"
        "--- a/app/greet.py\n"
        "+++ b/app/greet.py\n"
        "@@ -1,2 +1,4 @@\n"
        " def greet(name):\n"
        "+    if not name:\n"
        "+        return 'Hello!'\n"
        "     return 'Hello, ' + name[0].upper() + name[1:] + '!'\n"
        "```",
        "Now write the diff that fixes the issue above.",
    ),
}
