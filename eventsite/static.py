"""WhiteNoise's middleware, served both ways: its own files answered as WhiteNoise does, every
other request passed on to a synchronous (WSGI) or an asynchronous (ASGI) handler as it
is, so that under ASGI no request is put on a thread of its own because of it."""

from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.http import HttpRequest, HttpResponseBase
from whitenoise.middleware import WhiteNoiseMiddleware


class StaticFiles(WhiteNoiseMiddleware):  # type: ignore[misc]  # whitenoise ships no types
    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Any = None, **kwargs: Any) -> None:
        super().__init__(get_response, **kwargs)
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self.__acall__(request)
        return super().__call__(request)

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        static_file = self.find_file(request.path_info) if self.autorefresh else self.files.get(request.path_info)
        if static_file is not None:
            served: HttpResponseBase = await sync_to_async(self.serve)(static_file, request)
            return served
        response: HttpResponseBase = await self.get_response(request)
        return response
