"""``data.apply_chat_template_kwargs`` against the chat template that renders the prompts: transformers hands every
extra argument to the template as a variable and a template that never names it renders as if it were not given
(``enable_thinking=false`` with a template without thinking, or a misspelt key), so such an entry gets a warning
before the workers start.
"""
from __future__ import annotations

import inspect
import logging

__all__ = ["template_variables", "unread_template_kwargs", "warn_unread_template_kwargs"]

logger = logging.getLogger(__name__)


def template_variables(template) -> set[str] | None:
    """The variables a Jinja chat template reads from its context (``jinja2.meta.find_undeclared_variables``);
    ``template`` a string or a ``{name: template}`` dict (every one counted). None when there is no template or one
    does not parse with plain Jinja (a tag of an extension): nothing is then known."""
    import jinja2
    import jinja2.ext
    from jinja2 import meta

    texts = list(template.values()) if isinstance(template, dict) else [template]
    if not texts or not all(isinstance(t, str) for t in texts):
        return None
    env = jinja2.Environment(extensions=[jinja2.ext.loopcontrols])
    found: set[str] = set()
    try:
        for text in texts:
            found |= meta.find_undeclared_variables(env.parse(text))
    except jinja2.TemplateSyntaxError:
        return None
    return found


def unread_template_kwargs(kwargs: dict, tokenizer, processor=None) -> list[str]:
    """One warning line per entry of ``kwargs`` (``data.apply_chat_template_kwargs``) that neither
    ``apply_chat_template`` itself takes (its named parameters: ``tools``, ``continue_final_message``, ...) nor any
    chat template of ``tokenizer`` / ``processor`` reads; [] when a template is missing or unparsed (not known)."""
    if not kwargs:
        return []
    owners = [o for o in (tokenizer, processor) if o is not None]
    templates = [getattr(o, "chat_template", None) for o in owners]
    names = [template_variables(t) for t in templates if t is not None]
    if not names or any(n is None for n in names):
        return []
    read = set().union(*names)
    for owner in owners:
        read |= {p.name for p in inspect.signature(owner.apply_chat_template).parameters.values()
                 if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    from trainer.verl_compat import _fmt

    return [f"data.apply_chat_template_kwargs.{key}={_fmt(value)}: ignored: the chat template never reads "
            f"'{key}'; check the key's spelling or the template (actor_rollout_ref.model.custom_chat_template)"
            for key, value in kwargs.items() if key not in read]


def warn_unread_template_kwargs(kwargs: dict, tokenizer, processor=None) -> None:
    """Log :func:`unread_template_kwargs`' lines as warnings (once per run, before the datasets are built)."""
    for line in unread_template_kwargs(kwargs, tokenizer, processor):
        logger.warning(line)
