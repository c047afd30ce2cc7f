//! The checks every request runs, in this order: authentication and authorization
//! ([`auth`]), the audit line around the rest ([`audit`]), the request rates ([`rate`]),
//! the Host and admin checks and the time budget ([`limits`]), then, on a DC group's
//! follower, a write goes to the leader ([`forward`]); then the routes.
//!
//! They run before routing, around the router as a whole ([`App`]), not as an axum layer on
//! every route: a layer boxes a future and a service and clones the stack below it for
//! every request (docs/benchmarks.md, issue 21). The two requests every client repeats, a
//! plain discovery and a single renewal, are then answered without the router at all
//! (`http::plain`, the same answer as their routes).

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::Request;
use axum::response::Response;
use axum::Router;
use futures::future::BoxFuture;

use super::{audit, auth, forward, limits, rate};
use crate::shared::NodeShared;

/// The node's HTTP application: the checks of this module, then the routes. A tower
/// service, as the listener and the leader's serving of forwarded writes take it.
#[derive(Clone)]
pub struct App {
    node: Arc<NodeShared>,
    routes: Router,
}

impl App {
    pub fn new(node: Arc<NodeShared>, routes: Router) -> App {
        App { node, routes }
    }
}

impl tower_service::Service<Request> for App {
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let app = self.clone();
        Box::pin(async move { Ok(checks(&app.node, req, &app.routes).await) })
    }
}

async fn checks(node: &NodeShared, req: Request, routes: &Router) -> Response {
    // Outermost: a request without a valid token is refused before it can use any shared
    // budget (the admin call rate among them).
    let mut req = match auth::authorize(node, req).await {
        Ok(req) => req,
        Err(refused) => return refused,
    };
    // Inside authentication (it knows the principal): state changes, admin calls and
    // refusals to the audit log.
    let pending = audit::begin(node, &mut req);
    let resp = admitted(node, req, routes).await;
    audit::finish(node, pending, &resp);
    resp
}

async fn admitted(node: &NodeShared, req: Request, routes: &Router) -> Response {
    if let Some(refused) = rate::refusal(node, &req) {
        return refused;
    }
    let limit = match limits::admit(node, &req) {
        Ok(limit) => limit,
        Err(refused) => return *refused,
    };
    // Innermost: on a DC group's follower, a write goes to the leader (every check around
    // it ran here first).
    match tokio::time::timeout(limit, forward::writes(node, req, routes)).await {
        Ok(resp) => resp,
        Err(_) => limits::timed_out(node, limit),
    }
}

/// The answer to `req`: a plain discovery or renewal without the router
/// (`http::plain`), any other request by its route.
pub async fn route(node: &NodeShared, routes: &Router, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    if let Some(answer) = super::plain(node, &parts).await {
        return answer;
    }
    let req = Request::from_parts(parts, body);
    let mut routes = routes.clone();
    match tower_service::Service::call(&mut routes, req).await {
        Ok(resp) => resp,
        Err(never) => match never {},
    }
}
