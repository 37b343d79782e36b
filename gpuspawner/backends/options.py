"""The spawn form and user_options, the same on every backend: :class:`GPUOptionsMixin`.

A parent of :class:`~gpuspawner.backends.base.GPUSpawnerMixin`. It draws the form
(profiles, GPU counts and models, live availability), reads a submitted form or a
``/hub/spawn?...`` query as user_options, and checks user_options (form or REST: HTTP 400
naming the field, 403 for another group's profile) before anything starts, applying the
chosen profile to the spawner. Backends whose form is drawn otherwise (gpu-kube: KubeSpawner's
profile form) override the readers; backends that count GPUs their own way override
:meth:`GPUOptionsMixin.options_form_context` and :meth:`GPUOptionsMixin.offered_models`.
"""

from __future__ import annotations

import time
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape
from jupyterhub.utils import maybe_future
from sqlalchemy.orm import object_session
from tornado import web
from traitlets import default, observe
from traitlets.config import Configurable

from ..db import BookingStore
from ..form import form_context, has_choices
from ..profiles import OPTION_KEYS, Choice, OfferedImages, OptionsError, is_form_field, options_from_form, parse_options
from .errors import user_error

_templates = Environment(
    loader=PackageLoader("gpuspawner", "templates"),
    autoescape=select_autoescape(["html"]),
)


class GPUOptionsMixin(Configurable):
    """The spawn form and the checking of user_options (see the module's words)."""

    # ------------------------------------------------------------ the form
    #
    # A site's own Spawner hooks compose with gpuspawner's; none is replaced silently:
    # ``options_form`` (the site's form is shown below the GPU choices), ``options_from_form``
    # (the site's function reads the form's other fields; its keys are added to the GPU ones)
    # and ``apply_user_options`` (run after gpuspawner has checked and applied the GPU keys).
    # Where gpuspawner's form is the parent's own form (gpu-kube: KubeSpawner's profile form),
    # the site's form and form reader replace it, as they replace the parent's.

    #: True where gpuspawner's form stands in for the parent spawner's own (gpu-kube): a site's
    #: ``options_form`` and ``options_from_form`` then replace it, as on the parent, and it is
    #: drawn even with nothing to choose, as the parent draws its own.
    form_is_the_parents = False

    #: what one place GPUs are on is called on this backend, in the form's words ("the largest
    #: host here has 2"): "host" (a machine), "node" (a cluster's)
    host_word = "host"

    @default("options_form")
    def _gpu_default_options_form(self):
        return self._render_options_form

    async def get_options_form(self) -> str:
        """The spawn form: the GPU choices, then the site's own ``options_form`` if it set one.

        Empty (JupyterHub then starts the server without a form) when there is nothing to
        choose and the site has no form: one profile, one GPU count, no model or image to pick.
        """
        theirs = self.options_form
        if theirs == self._render_options_form:
            return await self._render_options_form()
        if callable(theirs):
            theirs = await maybe_future(theirs(self))
        if self.form_is_the_parents:
            return theirs or ""
        return await self._render_options_form() + (theirs or "")

    async def _render_options_form(self, spawner=None) -> str:
        try:
            await self.ensure_reconciled()
        except Exception as e:  # the form still renders; a spawn will say what is wrong
            self.log.warning("%s: ledger not reconciled yet: %s", self._log_name, e)
        context = await self.options_form_context()
        if not (self.form_is_the_parents or has_choices(context)):
            return ""
        context["budget"] = self.budget_form_context(context)
        return _templates.get_template("form.html").render(**context)

    async def options_form_context(self) -> dict:
        """What the form shows; backends that count GPUs their own way override this."""
        reading = await self.inventory.read()
        bookings = self.hub_state.cached(BookingStore)  # made at the hub's start (hub.bookings)
        return form_context(self.profiles, reading, self.ledger.held(), self.user_options or {},
                            offered_images=self.offered_images(), default_image=self.default_image(),
                            host=self.host_word, bookings=bookings.all() if bookings else (), now=time.time(),
                            queue_estimates=self.queue_form_estimates(self.profiles, reading.gpus))

    async def offered_models(self) -> set[str]:
        """The model slugs users may pick (``gpu_model``); backends override with their inventory."""
        return set((await self.inventory.read()).models)

    def offered_images(self) -> OfferedImages:
        """The images a profile without ``images`` offers (:data:`~gpuspawner.profiles.OfferedImages`):
        none here; gpu-docker offers DockerSpawner's ``allowed_images``."""
        return None

    def default_image(self) -> str | None:
        """The image a server gets when the user picks none (preselected among :meth:`offered_images`)."""
        return None

    async def gpus_found(self) -> bool:
        """Whether this hub found any GPU to give out. Where it found none (NVML finds none, an
        empty static inventory, a cluster without GPU nodes), the profiles that run without a GPU
        are offered and are the default (:func:`~gpuspawner.profiles.without_gpus`)."""
        return not (await self.options_form_context())["no_gpus"]

    @default("options_from_form")
    def _gpu_default_options_from_form(self):
        return self.gpu_options_from_form

    def gpu_options_from_form(self, formdata) -> dict:
        """gpuspawner's spawn-form fields as user_options (400 naming a malformed field).

        Backends whose form names its fields otherwise (gpu-kube) override this and
        :meth:`gpu_form_field`.
        """
        try:
            return options_from_form(formdata)
        except OptionsError as e:
            raise user_error(400, str(e)) from e

    def gpu_form_field(self, name: str) -> bool:
        """Whether the spawn form field ``name`` is gpuspawner's (not the site's own form's)."""
        return is_form_field(name, [p.slug for p in self.all_profiles()])

    def run_options_from_form(self, form_data):
        """A submitted spawn form as user_options.

        gpuspawner's fields give the GPU options. A site's own ``options_from_form``
        (``c.Spawner.options_from_form``) is called, as JupyterHub calls it, with the
        form's other fields, and its keys are added; where both give a key, the site's wins.
        Where the form is the parent's (``form_is_the_parents``), the site's reads it all and
        its answer is the user_options, as on the parent.
        """
        if self.options_from_form == self.gpu_options_from_form:
            return self.gpu_options_from_form(form_data)
        if self.form_is_the_parents:
            return super().run_options_from_form(form_data)
        ours = {key: value for key, value in form_data.items() if self.gpu_form_field(key)}
        theirs = {key: value for key, value in form_data.items() if key not in ours}
        options = self.gpu_options_from_form(ours)
        options.update(super().run_options_from_form(theirs))
        return options

    def options_from_query(self, query_data):
        """``/hub/spawn?profile=gpu&gpus=2``: read as a submitted form is."""
        return self.run_options_from_form(query_data)

    def site_reads_options(self) -> bool:
        """Whether the site's own hooks read user_options keys of their own (its ``options_form``,
        ``options_from_form`` or ``apply_user_options`` is configured): those keys are then kept
        for them, not refused."""
        return (self.apply_user_options is not None
                or self.options_from_form != self.gpu_options_from_form
                or self.options_form != self._render_options_form)

    # ------------------------------------------------------------ user options

    #: the user_options before this spawn's (JupyterHub saves a spawn's options before checking them)
    _gpu_previous_options: dict | None = None

    @observe("user_options")
    def _remember_previous_options(self, change) -> None:
        self._gpu_previous_options = change["old"] if isinstance(change["old"], dict) else {}

    async def _run_apply_user_options(self, user_options):
        """JupyterHub's step that applies a spawn's user_options (JupyterHub >= 5.3).

        First :meth:`_apply_gpu_options` (400 on bad input), then the site's own
        ``apply_user_options`` hook, if any, as JupyterHub runs it (a dict hook is given
        only the keys it names besides the site's own). A refused request leaves the
        server's saved options as they were (JupyterHub stored them before asking), so
        nothing refused is kept, and every later answer about the server (its model, the
        form) is valid JSON.
        """
        try:
            await self._apply_gpu_options(user_options)
            hook = self.apply_user_options
            if isinstance(hook, dict):
                user_options = {k: v for k, v in user_options.items() if k in hook or k not in OPTION_KEYS}
            elif hook is None:  # JupyterHub warns about keys nobody handles: gpuspawner handled its own
                user_options = {k: v for k, v in user_options.items() if k not in OPTION_KEYS}
            await super()._run_apply_user_options(user_options)
        except web.HTTPError:
            self._restore_previous_options()
            raise

    def _restore_previous_options(self) -> None:
        previous = dict(self._gpu_previous_options or {})
        self.user_options = previous
        orm_spawner = getattr(self, "orm_spawner", None)
        if orm_spawner is not None and orm_spawner.user_options != previous:
            orm_spawner.user_options = previous
            session = object_session(orm_spawner)
            if session is not None:
                session.commit()

    async def _apply_gpu_options(self, user_options: dict[str, Any]) -> None:
        """Check user_options (form or REST) and apply the profile; 400 on bad input."""
        models = await self.offered_models()
        try:
            choice = parse_options(user_options, self.profiles_for_options(user_options), models,
                                   offered_images=self.offered_images(), no_gpus=not await self.gpus_found(),
                                   site_keys=self.site_reads_options())
        except OptionsError as e:
            raise user_error(400, str(e)) from e
        self.gpu_choice = choice
        self.apply_profile(choice)
        self.apply_queue_policy(choice)
        self.apply_budget(choice)  # a spent GPU-hour budget: 422 (or last in the queue), nothing held

    async def apply_job_options(self, options: dict[str, Any]) -> Choice:
        """A notebook GPU job's GPU choice (its body's ``profile``, ``gpus``, ``gpu_model``, ``image``),
        checked and applied as a server's user_options are (400/403 with a sentence; gpu-kube:
        checked now, its profile applied when the job's pod is made). The one step the job manager
        takes into the spawner itself; everything else goes through the backend's job runner."""
        self.user_options = dict(options)
        await self._apply_gpu_options(self.user_options)
        return self.gpu_choice

    def apply_profile(self, choice: Choice) -> None:
        """Copy the profile's limits and image to the spawner; backends extend this."""
        if choice.profile.cpu_limit is not None:
            self.cpu_limit = float(choice.profile.cpu_limit)
        if choice.profile.mem_limit is not None:
            self.mem_limit = choice.profile.mem_limit
